//! NBD URIs, as libnbd, qemu and fio write them: `nbd://HOST[:PORT]/EXPORT`,
//! `nbd+unix:///EXPORT?socket=PATH`, and with TLS (pre-shared keys, as libnbd writes it)
//! `nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::proto::NBD_DEFAULT_PORT;

/// Where an NBD export is and what it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdUri {
    /// `tls` is set for `nbds://`.
    Tcp {
        host: String,
        port: u16,
        export_name: String,
        tls: Option<UriTls>,
    },
    Unix {
        socket_path: PathBuf,
        export_name: String,
    },
}

/// The TLS credentials an `nbds://` URI names: a PSK user and the psktool file with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriTls {
    pub username: String,
    pub psk_file: PathBuf,
}

const ALLOWED_FORMS: &str = "nbd://HOST[:PORT]/EXPORT, nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH or nbd+unix:///EXPORT?socket=PATH";

/// A URI that could not be parsed: the URI, what is wrong with it, and the allowed forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriError {
    pub uri: String,
    pub problem: String,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid NBD URI {:?}: {}; allowed: {ALLOWED_FORMS}", self.uri, self.problem)
    }
}

impl std::error::Error for UriError {}

impl NbdUri {
    pub fn export_name(&self) -> &str {
        match self {
            NbdUri::Tcp { export_name, .. } | NbdUri::Unix { export_name, .. } => export_name,
        }
    }
}

impl FromStr for NbdUri {
    type Err = UriError;

    fn from_str(uri: &str) -> Result<NbdUri, UriError> {
        let error = |problem: String| UriError { uri: uri.to_string(), problem };
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(error("missing scheme".into()));
        };
        if rest.contains('#') {
            return Err(error("fragments (#...) are not allowed".into()));
        }
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let export_name = percent_decode(path).map_err(error)?;
        match scheme {
            "nbd" => parse_tcp(authority, query, export_name).map_err(error),
            "nbds" => parse_tls(authority, query, export_name).map_err(error),
            "nbd+unix" => parse_unix(authority, query, export_name).map_err(error),
            "nbds+unix" => Err(error("TLS over a Unix socket is not supported; use nbd+unix:// (the socket is owner-only)".into())),
            _ => Err(error(format!("unknown scheme {scheme:?}"))),
        }
    }
}

fn parse_tcp(authority: &str, query: &str, export_name: String) -> Result<NbdUri, String> {
    if !query.is_empty() {
        return Err(format!("query {query:?} is not allowed with nbd://"));
    }
    parse_host_port(authority, export_name)
}

fn parse_host_port(authority: &str, export_name: String) -> Result<NbdUri, String> {
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err("nbd:// needs a host".into());
    }
    let port = match port {
        None => NBD_DEFAULT_PORT,
        Some(port) => port.parse().map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?,
    };
    Ok(NbdUri::Tcp { host: host.to_string(), port, export_name, tls: None })
}

/// `nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH` (`tls-username=USER` may name the user
/// instead, as libnbd allows). storc's client speaks TLS with pre-shared keys only.
fn parse_tls(authority: &str, query: &str, export_name: String) -> Result<NbdUri, String> {
    let (mut username, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (Some(percent_decode(user)?), host_port),
        None => (None, authority),
    };
    let mut psk_file = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        match parameter.split_once('=') {
            Some(("tls-psk-file", path)) if !path.is_empty() => psk_file = Some(PathBuf::from(percent_decode(path)?)),
            Some(("tls-username", user)) if !user.is_empty() => username = Some(percent_decode(user)?),
            Some(("tls-certificates", _)) => {
                return Err("tls-certificates (X.509) is not supported by storc's client; use tls-psk-file=PATH".into());
            }
            _ => {
                return Err(format!(
                    "query parameter {parameter:?} is not allowed with nbds://; allowed: tls-psk-file=PATH, tls-username=USER"
                ))
            }
        }
    }
    let psk_file = psk_file.ok_or("nbds:// needs ?tls-psk-file=PATH (storc's client speaks TLS with pre-shared keys)")?;
    let username = username.filter(|user| !user.is_empty()).ok_or("nbds:// needs a PSK user: nbds://USER@HOST/EXPORT?tls-psk-file=PATH")?;
    let NbdUri::Tcp { host, port, export_name, .. } = parse_host_port(host_port, export_name)? else { unreachable!("a TCP URI") };
    Ok(NbdUri::Tcp { host, port, export_name, tls: Some(UriTls { username, psk_file }) })
}

/// Splits `host[:port]`, where an IPv6 host is written in brackets.
fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or("unclosed '[' in host")?;
        return match after {
            "" => Ok((host, None)),
            _ => after.strip_prefix(':').map(|port| (host, Some(port))).ok_or_else(|| format!("unexpected {after:?} after host")),
        };
    }
    Ok(match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

fn parse_unix(authority: &str, query: &str, export_name: String) -> Result<NbdUri, String> {
    if !authority.is_empty() {
        return Err(format!("nbd+unix:// takes no host (got {authority:?}); write nbd+unix:///EXPORT?socket=PATH"));
    }
    let mut socket_path = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        match parameter.split_once('=') {
            Some(("socket", path)) if !path.is_empty() => socket_path = Some(percent_decode(path)?),
            _ => return Err(format!("query parameter {parameter:?} is not allowed; only socket=PATH is")),
        }
    }
    let socket_path = socket_path.ok_or("nbd+unix:// needs ?socket=PATH")?;
    Ok(NbdUri::Unix { socket_path: PathBuf::from(socket_path), export_name })
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] != b'%' {
            out.push(bytes[index]);
            index += 1;
            continue;
        }
        let hex = text.get(index + 1..index + 3).ok_or_else(|| format!("incomplete escape in {text:?}"))?;
        let byte = u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape %{hex} in {text:?}"))?;
        out.push(byte);
        index += 3;
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} does not decode to UTF-8"))
}

/// Escapes everything but unreserved characters and '/', so the URI parses back the same.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NbdUri::Tcp { host, port, export_name, tls } => {
                let host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
                match tls {
                    None => write!(f, "nbd://{host}:{port}/{}", percent_encode(export_name)),
                    Some(UriTls { username, psk_file }) => write!(
                        f,
                        "nbds://{}@{host}:{port}/{}?tls-psk-file={}",
                        percent_encode(username),
                        percent_encode(export_name),
                        percent_encode(&psk_file.to_string_lossy())
                    ),
                }
            }
            NbdUri::Unix { socket_path, export_name } => {
                write!(f, "nbd+unix:///{}?socket={}", percent_encode(export_name), percent_encode(&socket_path.to_string_lossy()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(uri: &str, expected: Result<NbdUri, &str>) {
        let actual = uri.parse::<NbdUri>().map_err(|error| error.problem);
        assert_eq!(actual, expected.map_err(str::to_string), "{uri}");
    }

    fn tcp(host: &str, port: u16, export_name: &str) -> NbdUri {
        NbdUri::Tcp { host: host.into(), port, export_name: export_name.into(), tls: None }
    }

    fn tls(user: &str, host: &str, port: u16, export_name: &str, psk_file: &str) -> NbdUri {
        let tls = Some(UriTls { username: user.into(), psk_file: psk_file.into() });
        NbdUri::Tcp { host: host.into(), port, export_name: export_name.into(), tls }
    }

    fn unix(path: &str, export_name: &str) -> NbdUri {
        NbdUri::Unix { socket_path: path.into(), export_name: export_name.into() }
    }

    #[test]
    fn valid_uris_parse() {
        check("nbd://localhost/vd0", Ok(tcp("localhost", 10809, "vd0")));
        check("nbd://127.0.0.1:10810/vd0", Ok(tcp("127.0.0.1", 10810, "vd0")));
        check("nbd://[::1]:9000/a/b", Ok(tcp("::1", 9000, "a/b")));
        check("nbd://[::1]", Ok(tcp("::1", 10809, "")));
        check("nbd://host", Ok(tcp("host", 10809, "")));
        check("nbd://host/with%20space", Ok(tcp("host", 10809, "with space")));
        check("nbd+unix:///vd0?socket=/run/storc.sock", Ok(unix("/run/storc.sock", "vd0")));
        check("nbd+unix://?socket=/tmp/s", Ok(unix("/tmp/s", "")));
        check("nbds://alice@127.0.0.1:10809/v0?tls-psk-file=/k/keys.psk", Ok(tls("alice", "127.0.0.1", 10809, "v0", "/k/keys.psk")));
        check("nbds://[::1]/v0?tls-psk-file=k.psk&tls-username=bob", Ok(tls("bob", "::1", 10809, "v0", "k.psk")));
    }

    #[test]
    fn invalid_uris_say_what_is_wrong() {
        check("localhost:10809", Err("missing scheme"));
        check("http://host/x", Err("unknown scheme \"http\""));
        check("nbds://host/x?tls-psk-file=k", Err("nbds:// needs a PSK user: nbds://USER@HOST/EXPORT?tls-psk-file=PATH"));
        check("nbds://a@host/x", Err("nbds:// needs ?tls-psk-file=PATH (storc's client speaks TLS with pre-shared keys)"));
        check(
            "nbds://host/x?tls-certificates=/d",
            Err("tls-certificates (X.509) is not supported by storc's client; use tls-psk-file=PATH"),
        );
        check("nbds+unix:///x?socket=/s", Err("TLS over a Unix socket is not supported; use nbd+unix:// (the socket is owner-only)"));
        check("nbd:///x", Err("nbd:// needs a host"));
        check("nbd://host:99999/x", Err("port \"99999\" is not a number from 0 to 65535"));
        check("nbd://host/x?socket=/s", Err("query \"socket=/s\" is not allowed with nbd://"));
        check("nbd+unix:///x", Err("nbd+unix:// needs ?socket=PATH"));
        check("nbd+unix://host/x?socket=/s", Err("nbd+unix:// takes no host (got \"host\"); write nbd+unix:///EXPORT?socket=PATH"));
        check("nbd+unix:///x?sock=/s", Err("query parameter \"sock=/s\" is not allowed; only socket=PATH is"));
        check("nbd://host/%zz", Err("bad escape %zz in \"%zz\""));
        check("nbd://[::1/x", Err("unclosed '[' in host"));
    }

    #[test]
    fn the_error_names_the_uri_and_the_allowed_forms() {
        let error = "ftp://x".parse::<NbdUri>().unwrap_err().to_string();
        assert_eq!(
            error,
            "invalid NBD URI \"ftp://x\": unknown scheme \"ftp\"; allowed: nbd://HOST[:PORT]/EXPORT, \
             nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH or nbd+unix:///EXPORT?socket=PATH"
        );
    }

    #[test]
    fn display_parses_back() {
        for uri in [tcp("::1", 1, "a b/c"), tcp("h", 10809, ""), unix("/tmp/x y.sock", "vd%0"), tls("a@b", "h", 1, "v", "/k k.psk")] {
            assert_eq!(uri.to_string().parse::<NbdUri>(), Ok(uri.clone()), "{uri}");
        }
        assert_eq!(unix("/tmp/s", "vd0").to_string(), "nbd+unix:///vd0?socket=/tmp/s");
    }
}
