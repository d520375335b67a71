//! `--drive` specs of NBD member drives: an NBD URI (`nbd://`, `nbds://`, `nbd+unix://`) with
//! one parameter of storc's own in its query, `timeout=DURATION`, taken out before the rest is
//! parsed as the URI libnbd and qemu would read.

use crate::uri::NbdUri;
use std::fmt;
use std::time::Duration;

/// How long a request may wait for its reply before the link counts as stalled, when the spec
/// does not say.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The shortest `timeout=`: below it a busy remote disk's flush would cut a healthy link.
pub const TIMEOUT_MIN: Duration = Duration::from_secs(1);
/// The longest `timeout=`: a VD stalls this long on a dead link before it goes on degraded.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(300);

const ALLOWED: &str =
    "allowed: nbd://HOST[:PORT]/EXPORT[?timeout=DURATION], nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH[&timeout=DURATION] \
                       or nbd+unix:///EXPORT?socket=PATH[&timeout=DURATION], DURATION from 1s to 300s (e.g. 5s, 1500ms, 2m)";

/// An NBD member drive as `--drive` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    pub uri: NbdUri,
    /// A request without a reply this long fails, and the link is cut and reconnected.
    pub timeout: Duration,
    /// The spec as given, for names and events.
    pub text: String,
}

/// A spec that is not an NBD member: what is wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl MemberSpec {
    /// Whether `text` asks for an NBD member (its scheme), so that a caller with other kinds of
    /// drives knows to parse it here and show this parser's errors.
    pub fn is_nbd(text: &str) -> bool {
        ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"].iter().any(|scheme| text.starts_with(scheme))
    }

    /// # Errors
    /// A bad URI, or a `timeout` that is not a duration within the bounds; the error names the
    /// spec, the problem, and the allowed forms.
    pub fn parse(text: &str) -> Result<MemberSpec, SpecError> {
        let error = |problem: String| SpecError(format!("NBD member {text:?}: {problem}; {ALLOWED}"));
        let (before_query, query) = text.split_once('?').unwrap_or((text, ""));
        let mut timeout = None;
        let mut kept = Vec::new();
        for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
            match parameter.split_once('=') {
                Some(("timeout", _)) if timeout.is_some() => return Err(error("timeout= is given twice".into())),
                Some(("timeout", value)) => timeout = Some(parse_timeout(value).map_err(error)?),
                _ => kept.push(parameter),
            }
        }
        let uri_text = if kept.is_empty() { before_query.to_string() } else { format!("{before_query}?{}", kept.join("&")) };
        let uri = uri_text.parse::<NbdUri>().map_err(|e| error(e.problem))?;
        Ok(MemberSpec { uri, timeout: timeout.unwrap_or(TIMEOUT_DEFAULT), text: text.to_string() })
    }
}

/// `5s`, `1500ms`, `2m`, or a bare number of seconds, within [`TIMEOUT_MIN`]..=[`TIMEOUT_MAX`].
fn parse_timeout(value: &str) -> Result<Duration, String> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("timeout={value:?} does not start with a number"))?;
    let timeout = match unit {
        "" | "s" => Duration::from_secs(number),
        "ms" => Duration::from_millis(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        _ => return Err(format!("timeout={value:?} has unit {unit:?}; allowed: ms, s, m")),
    };
    if !(TIMEOUT_MIN..=TIMEOUT_MAX).contains(&timeout) {
        return Err(format!("timeout={value} is outside 1s to 300s"));
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_and_without_a_timeout() {
        let spec = MemberSpec::parse("nbd://10.77.0.1:10809/disk?timeout=5s").unwrap();
        assert_eq!(spec.uri, NbdUri::Tcp { host: "10.77.0.1".into(), port: 10809, export_name: "disk".into(), tls: None });
        assert_eq!(spec.timeout, Duration::from_secs(5));
        assert_eq!(MemberSpec::parse("nbd://h/x").unwrap().timeout, TIMEOUT_DEFAULT);
        let unix = MemberSpec::parse("nbd+unix:///x?timeout=1500ms&socket=/run/s.sock").unwrap();
        assert_eq!(unix.uri, NbdUri::Unix { socket_path: "/run/s.sock".into(), export_name: "x".into() });
        assert_eq!(unix.timeout, Duration::from_millis(1500));
        let tls = MemberSpec::parse("nbds://a@h/x?tls-psk-file=/k.psk&timeout=2m").unwrap();
        assert!(matches!(tls.uri, NbdUri::Tcp { tls: Some(_), .. }));
        assert_eq!(tls.timeout, Duration::from_secs(120));
        assert_eq!(MemberSpec::parse("nbd://h/x?timeout=30").unwrap().timeout, Duration::from_secs(30));
    }

    #[test]
    fn bad_specs_say_what_is_wrong_and_what_is_allowed() {
        let check = |text: &str, problem: &str| {
            let message = MemberSpec::parse(text).unwrap_err().0;
            assert!(message.contains(problem), "{text}: {message}");
            assert!(message.starts_with(&format!("NBD member {text:?}: ")), "{message}");
            assert!(message.ends_with("(e.g. 5s, 1500ms, 2m)"), "{message}");
        };
        check("nbd://h/x?timeout=0s", "timeout=0s is outside 1s to 300s");
        check("nbd://h/x?timeout=301s", "outside 1s to 300s");
        check("nbd://h/x?timeout=5h", "has unit \"h\"; allowed: ms, s, m");
        check("nbd://h/x?timeout=soon", "does not start with a number");
        check("nbd://h/x?timeout=5s&timeout=6s", "timeout= is given twice");
        check("nbd://h/x?socket=/s", "query \"socket=/s\" is not allowed with nbd://");
        check("nbd:///x", "nbd:// needs a host");
        check("nbd+unix:///x?timeout=5s", "nbd+unix:// needs ?socket=PATH");
    }

    #[test]
    fn only_nbd_schemes_are_nbd_members() {
        assert!(MemberSpec::is_nbd("nbd://h/x") && MemberSpec::is_nbd("nbd+unix:///x?socket=/s") && MemberSpec::is_nbd("nbds://a@h/x"));
        assert!(!MemberSpec::is_nbd("/var/lib/disk.img") && !MemberSpec::is_nbd("mem:1GiB") && !MemberSpec::is_nbd("nbd.img"));
    }
}
