//! `rbd:POOL/IMAGE[?conf=PATH&id=USER&timeout=SECONDS]` as text: parsed into an [`RbdSpec`] and written back.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The form of an RBD drive, for help texts and error messages.
pub const RBD_FORM: &str = "rbd:POOL/IMAGE[?conf=PATH&id=USER&timeout=SECONDS]";

/// The bounds of `timeout=`: shorter would give up on a busy cluster's ordinary latency, longer
/// would hold a VD's writes for ten minutes.
const TIMEOUT_SECONDS_MIN: u64 = 1;
const TIMEOUT_SECONDS_MAX: u64 = 600;

/// Where an RBD image is and who opens it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// The cluster's ceph.conf; without it librados looks where the `rbd` CLI does: `$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`.
    pub conf: Option<PathBuf>,
    /// The cephx user without `client.` (`admin` when not given).
    pub id: Option<String>,
    /// How long librbd may hold a write or a flush before the drive is given up
    /// (`timeout=`; `None`: the drive's default, 60 s).
    pub op_timeout: Option<Duration>,
}

impl RbdSpec {
    /// Parses the text after `rbd:`.
    ///
    /// # Errors
    /// A message naming the wrong part and the allowed form.
    pub fn parse(text: &str) -> Result<RbdSpec, String> {
        let wrong = |problem: String| format!("rbd:{text}: {problem}; allowed: {RBD_FORM}");
        let (name, query) = match text.split_once('?') {
            Some((name, query)) => (name, Some(query)),
            None => (text, None),
        };
        let (pool, image) = name.split_once('/').ok_or_else(|| wrong("expected POOL/IMAGE".into()))?;
        if pool.is_empty() || image.is_empty() {
            return Err(wrong(format!("the {} is empty", if pool.is_empty() { "pool" } else { "image" })));
        }
        if image.contains('/') {
            return Err(wrong(format!("{image:?} holds a '/': RBD namespaces (POOL/NAMESPACE/IMAGE) are not supported")));
        }
        if image.contains('@') {
            return Err(wrong(format!("{image:?} names a snapshot: a member drive must be writable")));
        }
        let mut spec = RbdSpec { pool: pool.to_string(), image: image.to_string(), conf: None, id: None, op_timeout: None };
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            let (key, value) = pair.split_once('=').ok_or_else(|| wrong(format!("{pair:?} is not KEY=VALUE")))?;
            if value.is_empty() {
                return Err(wrong(format!("{key}= has no value")));
            }
            let duplicate = match key {
                "conf" => spec.conf.replace(PathBuf::from(value)).is_some(),
                "id" => spec.id.replace(value.strip_prefix("client.").unwrap_or(value).to_string()).is_some(),
                "timeout" => spec.op_timeout.replace(parse_timeout(value).map_err(wrong)?).is_some(),
                _ => return Err(wrong(format!("unknown key {key:?} (allowed keys: conf, id, timeout)"))),
            };
            if duplicate {
                return Err(wrong(format!("{key}= is given twice")));
            }
        }
        Ok(spec)
    }

    /// The same spec for another image of the pool.
    pub fn with_image(&self, image: String) -> RbdSpec {
        RbdSpec { image, ..self.clone() }
    }

    /// `client.USER`, the name librados authenticates as.
    pub fn client_name(&self) -> String {
        format!("client.{}", self.id.as_deref().unwrap_or("admin"))
    }

    /// `POOL/IMAGE`, as the `rbd` CLI names it.
    pub fn image_path(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

/// `rbd:POOL/IMAGE` with the keys that were given, in a fixed order.
/// `timeout=`: whole seconds, `30` or `30s`, within the bounds above.
fn parse_timeout(value: &str) -> Result<Duration, String> {
    let seconds: u64 = value
        .strip_suffix('s')
        .unwrap_or(value)
        .parse()
        .map_err(|_| format!("timeout={value} is not a whole number of seconds (e.g. timeout=30s)"))?;
    if !(TIMEOUT_SECONDS_MIN..=TIMEOUT_SECONDS_MAX).contains(&seconds) {
        return Err(format!("timeout={value} is outside {TIMEOUT_SECONDS_MIN} to {TIMEOUT_SECONDS_MAX} seconds"));
    }
    Ok(Duration::from_secs(seconds))
}

impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rbd:{}/{}", self.pool, self.image)?;
        let mut separator = '?';
        if let Some(conf) = &self.conf {
            write!(f, "{separator}conf={}", conf.display())?;
            separator = '&';
        }
        if let Some(id) = &self.id {
            write!(f, "{separator}id={id}")?;
            separator = '&';
        }
        if let Some(timeout) = self.op_timeout {
            write!(f, "{separator}timeout={}s", timeout.as_secs())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_write_back() {
        let spec = RbdSpec::parse("rbd/disk0").unwrap();
        assert_eq!((spec.pool.as_str(), spec.image.as_str(), spec.conf.as_ref(), spec.id.as_ref()), ("rbd", "disk0", None, None));
        assert_eq!(spec.client_name(), "client.admin");
        let spec = RbdSpec::parse("fast/vm-1?conf=/etc/ceph/other.conf&id=storc").unwrap();
        assert_eq!(spec.conf, Some(PathBuf::from("/etc/ceph/other.conf")));
        assert_eq!(spec.client_name(), "client.storc");
        assert_eq!(spec.to_string(), "rbd:fast/vm-1?conf=/etc/ceph/other.conf&id=storc");
        assert_eq!(RbdSpec::parse("p/i?id=client.x").unwrap().to_string(), "rbd:p/i?id=x");
        assert_eq!(RbdSpec::parse("p/i?id=x").unwrap().with_image("j".into()).image_path(), "p/j");
        let spec = RbdSpec::parse("p/i?timeout=5&id=x").unwrap();
        assert_eq!(spec.op_timeout, Some(Duration::from_secs(5)));
        assert_eq!(spec.to_string(), "rbd:p/i?id=x&timeout=5s");
        assert_eq!(RbdSpec::parse("p/i?timeout=600s").unwrap().op_timeout, Some(Duration::from_secs(600)));
    }

    #[test]
    fn wrong_specs_name_the_wrong_part() {
        let check = |text: &str, expected: &str| {
            let message = RbdSpec::parse(text).unwrap_err();
            assert!(message.contains(expected), "{text}: {message:?} should contain {expected:?}");
            assert!(message.contains(RBD_FORM), "{message:?} should show the allowed form");
        };
        check("disk0", "expected POOL/IMAGE");
        check("/disk0", "the pool is empty");
        check("rbd/", "the image is empty");
        check("rbd/ns/disk0", "namespaces");
        check("rbd/disk0@snap", "snapshot");
        check("rbd/disk0?user=admin", "unknown key \"user\" (allowed keys: conf, id, timeout)");
        check("rbd/disk0?timeout=0", "timeout=0 is outside 1 to 600 seconds");
        check("rbd/disk0?timeout=fast", "timeout=fast is not a whole number of seconds");
        check("rbd/disk0?conf", "\"conf\" is not KEY=VALUE");
        check("rbd/disk0?conf=", "conf= has no value");
        check("rbd/disk0?id=a&id=b", "id= is given twice");
    }
}
