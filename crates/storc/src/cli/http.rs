//! A minimal blocking HTTP/1.1 client for the management API.
//!
//! One request per connection (`Connection: close`), so an answer ends at EOF and no connection
//! state is kept; the CLI sends at most a few requests per command, so nothing is lost by it.
//! Over a Unix socket, plain TCP (`tcp:HOST:PORT`) or HTTPS (`https://HOST:PORT`, `https`).

use super::https::HttpsEndpoint;
use serde::Serialize;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where `storc serve` puts its socket when started in the current directory with defaults.
pub const API_SOCKET_DEFAULT: &str = "./storc-data/api.sock";
/// The API token a request over TCP carries, unless `STORC_API_TOKEN` gives it: the one of a
/// daemon started in the current directory with defaults.
const API_TOKEN_FILE_DEFAULT: &str = "./storc-data/api.token";
/// Creating or deleting a VD writes metadata to every drive; a daemon silent for this long is stuck.
const ANSWER_TIMEOUT_SECS: u64 = 300;
/// Far above any real answer (the event list is the largest); stops a runaway peer.
const ANSWER_BYTES_MAX: u64 = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `host:port`, from `tcp:host:port`.
    Tcp(String),
    /// `https://host:port`, with the CAs to verify it against.
    Https(HttpsEndpoint),
}

/// Where the CLI's requests go: `--api` and `--api-ca`, then the environment's `STORC_API` and
/// `STORC_API_CA`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiSettings {
    pub api: Option<String>,
    pub ca: Option<String>,
}

impl Endpoint {
    /// `tcp:127.0.0.1:9090` is TCP, `https://127.0.0.1:8443` HTTPS; anything else is a Unix
    /// socket path.
    ///
    /// # Errors
    /// An https URL that is not `https://HOST:PORT`.
    pub fn parse(text: &str, ca_file: Option<PathBuf>) -> Result<Endpoint, String> {
        if let Some(rest) = text.strip_prefix("https://") {
            return HttpsEndpoint::parse(rest, ca_file).map(Endpoint::Https);
        }
        Ok(match text.strip_prefix("tcp:") {
            Some(address) => Endpoint::Tcp(address.to_string()),
            None => Endpoint::Unix(PathBuf::from(text)),
        })
    }

    /// `--api` wins over `STORC_API`, which wins over the default socket; `--api-ca` over
    /// `STORC_API_CA`.
    ///
    /// # Errors
    /// A malformed https URL, or `--api-ca` with an endpoint that is not https.
    pub fn choose(options: ApiSettings, env: ApiSettings) -> Result<Endpoint, String> {
        let text = options.api.or(env.api.filter(|value| !value.is_empty()));
        let ca_option = options.ca.clone();
        let ca = options.ca.or(env.ca.filter(|value| !value.is_empty())).map(PathBuf::from);
        let endpoint = Endpoint::parse(text.as_deref().unwrap_or(API_SOCKET_DEFAULT), ca)?;
        match (&endpoint, ca_option) {
            (Endpoint::Unix(_) | Endpoint::Tcp(_), Some(ca)) => Err(format!(
                "--api-ca {ca} applies to an HTTPS endpoint, and the endpoint is {endpoint}; allowed: --api-ca FILE with --api https://HOST:PORT"
            )),
            _ => Ok(endpoint),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "{}", path.display()),
            Endpoint::Tcp(address) => write!(f, "tcp:{address}"),
            Endpoint::Https(https) => write!(f, "{https}"),
        }
    }
}

/// Removes `--api VALUE`/`--api=VALUE` and `--api-ca FILE`/`--api-ca=FILE` from anywhere in
/// `args` (the last of each wins).
///
/// # Errors
/// An option without a value.
pub fn take_api_options(args: &mut Vec<String>) -> Result<ApiSettings, String> {
    Ok(ApiSettings {
        api: take_option(args, "--api", "a socket path, tcp:HOST:PORT or https://HOST:PORT")?,
        ca: take_option(args, "--api-ca", "a file of PEM CA certificates")?,
    })
}

fn take_option(args: &mut Vec<String>, name: &str, what: &str) -> Result<Option<String>, String> {
    let mut value = None;
    let mut index = 0;
    while index < args.len() {
        if let Some(given) = args[index].strip_prefix(name).and_then(|rest| rest.strip_prefix('=')) {
            value = Some(given.to_string());
            args.remove(index);
        } else if args[index] == name {
            if index + 1 == args.len() {
                return Err(format!("{name} needs {what}"));
            }
            value = Some(args.remove(index + 1));
            args.remove(index);
        } else {
            index += 1;
        }
    }
    Ok(value)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Patch,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    pub path: String,
    /// JSON, serialized in field order so that tests can compare it as text.
    pub body: Option<String>,
}

impl Request {
    pub fn get(path: &str) -> Request {
        Request::without_body(Method::Get, path)
    }

    pub fn without_body(method: Method, path: &str) -> Request {
        Request { method, path: path.to_string(), body: None }
    }

    pub fn with_body(method: Method, path: &str, body: &impl Serialize) -> Request {
        let json = serde_json::to_string(body).expect("API request types serialize to JSON");
        Request { method, path: path.to_string(), body: Some(json) }
    }

    /// The bytes on the wire; `host` only fills the Host header HTTP/1.1 requires.
    pub fn encode(&self, host: &str) -> Vec<u8> {
        self.encode_with_token(host, None)
    }

    /// As `encode`, with `Authorization: Bearer TOKEN` when a token is given (hex: it cannot end
    /// the header early).
    pub fn encode_with_token(&self, host: &str, token: Option<&str>) -> Vec<u8> {
        let body = self.body.as_deref().unwrap_or("");
        let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
        let head = format!(
            "{} {} HTTP/1.1\r\nHost: {host}\r\n{authorization}Content-Type: application/json\r\nAccept: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.method.as_str(),
            self.path,
            body.len()
        );
        [head.as_bytes(), body.as_bytes()].concat()
    }
}

/// `GET /api/v1/vds`, with the body after a space when there is one.
impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method.as_str(), self.path)?;
        match &self.body {
            Some(body) => write!(f, " {body}"),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status_code: u16,
    pub body: Vec<u8>,
}

/// Sends one request and reads the whole answer.
///
/// # Errors
/// A message for a person: the daemon cannot be reached, went silent, or answered garbage.
pub fn send(endpoint: &Endpoint, request: &Request) -> Result<Response, String> {
    let timeout = Some(Duration::from_secs(ANSWER_TIMEOUT_SECS));
    let exchanged = match endpoint {
        Endpoint::Unix(path) => {
            let stream = UnixStream::connect(path).map_err(|error| unreachable(endpoint, &error))?;
            stream.set_read_timeout(timeout).and_then(|()| stream.set_write_timeout(timeout)).map_err(|e| e.to_string())?;
            exchange(stream, &request.encode("localhost"))
        }
        Endpoint::Tcp(address) => {
            let token = api_token(std::env::var("STORC_API_TOKEN").ok(), Path::new(API_TOKEN_FILE_DEFAULT))?;
            let stream = TcpStream::connect(address).map_err(|error| unreachable(endpoint, &error))?;
            stream.set_read_timeout(timeout).and_then(|()| stream.set_write_timeout(timeout)).map_err(|e| e.to_string())?;
            exchange(stream, &request.encode_with_token(address, token.as_deref()))
        }
        Endpoint::Https(https) => {
            let token = api_token(std::env::var("STORC_API_TOKEN").ok(), Path::new(API_TOKEN_FILE_DEFAULT))?;
            let stream = https.connect(Duration::from_secs(ANSWER_TIMEOUT_SECS))?;
            exchange(stream, &request.encode_with_token(&https.host_header(), token.as_deref()))
        }
    };
    let raw = exchanged.map_err(|error| lost(endpoint, request, &error))?;
    parse_response(&raw).map_err(|why| {
        format!("the storc daemon at {endpoint} sent a malformed answer to {} {}: {why}", request.method.as_str(), request.path)
    })
}

/// The token for the TCP API: `STORC_API_TOKEN` if set, else the default data directory's token
/// file if there is one, else none (the daemon then answers 401 and says where its token is).
///
/// # Errors
/// The one given is not a token (hex digits), so it is not sent.
fn api_token(from_env: Option<String>, default_file: &Path) -> Result<Option<String>, String> {
    let (token, source) = match from_env.filter(|value| !value.trim().is_empty()) {
        Some(value) => (value, "STORC_API_TOKEN".to_string()),
        None => match std::fs::read_to_string(default_file) {
            Ok(text) => (text, default_file.display().to_string()),
            Err(_) => return Ok(None),
        },
    };
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{source} does not hold an API token (hex digits, as storc serve writes to <data-dir>/api.token)"));
    }
    Ok(Some(token.to_string()))
}

fn exchange(mut stream: impl Read + Write, request_bytes: &[u8]) -> io::Result<Vec<u8>> {
    stream.write_all(request_bytes)?;
    stream.flush()?;
    let mut raw = Vec::new();
    stream.take(ANSWER_BYTES_MAX).read_to_end(&mut raw)?;
    Ok(raw)
}

fn unreachable(endpoint: &Endpoint, error: &io::Error) -> String {
    format!("cannot reach the storc daemon at {endpoint} ({}); start it with: storc serve", io_reason(error))
}

fn lost(endpoint: &Endpoint, request: &Request, error: &io::Error) -> String {
    let reason = match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no answer within {ANSWER_TIMEOUT_SECS} s")
        }
        _ => io_reason(error),
    };
    format!("lost the storc daemon at {endpoint} during {} {} ({reason})", request.method.as_str(), request.path)
}

/// The operating system's words without Rust's " (os error 2)" suffix, which means nothing to a person.
pub(super) fn io_reason(error: &io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error ") {
        Some(end) => text[..end].to_string(),
        None => text,
    }
}

/// Parses a whole HTTP/1.1 answer: status line, headers, and a body framed by Content-Length,
/// chunked transfer encoding, or the end of the connection.
///
/// # Errors
/// What is malformed, for the error message.
pub fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("the headers never end")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "the headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_code = parse_status_line(lines.next().unwrap_or_default())?;
    let mut chunked = false;
    let mut content_length_bytes = None;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or_else(|| format!("header line {line:?} has no colon"))?;
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            "content-length" => {
                let length = value.parse::<usize>().map_err(|_| format!("Content-Length {value:?} is not a number"))?;
                content_length_bytes = Some(length);
            }
            _ => {}
        }
    }
    let rest = &raw[head_end + 4..];
    // RFC 9112 6.3: chunked framing overrides Content-Length.
    let body = match (chunked, content_length_bytes) {
        (true, _) => decode_chunked(rest)?,
        (false, Some(length)) if rest.len() < length => {
            return Err(format!("the body is {} bytes; Content-Length says {length}", rest.len()));
        }
        (false, Some(length)) => rest[..length].to_vec(),
        (false, None) => rest.to_vec(),
    };
    Ok(Response { status_code, body })
}

/// `HTTP/1.1 404 Not Found` to 404.
fn parse_status_line(line: &str) -> Result<u16, String> {
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("status line {line:?} is not HTTP/1.x"));
    }
    match code.parse::<u16>() {
        Ok(status_code) if (100..=599).contains(&status_code) => Ok(status_code),
        _ => Err(format!("status line {line:?} has no status code")),
    }
}

/// Joins the chunks of a chunked body; chunk extensions and trailers are ignored.
fn decode_chunked(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or("a chunk size line never ends")?;
        let line = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let chunk_bytes = usize::from_str_radix(size_text, 16).map_err(|_| format!("chunk size {size_text:?} is not hexadecimal"))?;
        rest = &rest[line_end + 2..];
        if chunk_bytes == 0 {
            return Ok(body);
        }
        if rest.len() < chunk_bytes + 2 {
            return Err(format!("a chunk of {chunk_bytes} bytes is cut short"));
        }
        if &rest[chunk_bytes..chunk_bytes + 2] != b"\r\n" {
            return Err(format!("a chunk of {chunk_bytes} bytes does not end with CRLF"));
        }
        body.extend_from_slice(&rest[..chunk_bytes]);
        rest = &rest[chunk_bytes + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(raw: &str, expected: Result<(u16, &str), &str>) {
        let parsed = parse_response(raw.as_bytes());
        let actual = match &parsed {
            Ok(response) => Ok((response.status_code, std::str::from_utf8(&response.body).unwrap())),
            Err(why) => Err(why.as_str()),
        };
        assert_eq!(actual, expected, "for {raw:?}");
    }

    #[test]
    fn responses() {
        check("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]", Ok((200, "[]")));
        check(
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"error\":\"no\"}",
            Ok((404, "{\"error\":\"no\"}")),
        );
        check("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]garbage after the body", Ok((200, "[]")));
        check("HTTP/1.0 200 OK\r\n\r\n{\"a\":1}", Ok((200, "{\"a\":1}")));
        check("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", Ok((204, "")));
        check("HTTP/1.1 200\r\nContent-Length: 1\r\n\r\n1", Ok((200, "1")));
    }

    #[test]
    fn chunked_responses() {
        check(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n[1,2\r\n2\r\n,3\r\n1;ext=x\r\n]\r\n0\r\n\r\n",
            Ok((200, "[1,2,3]")),
        );
        check("HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n", Ok((200, "0123456789")));
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\nok\r\n0\r\n\r\n", Ok((200, "ok")));
    }

    #[test]
    fn malformed_responses() {
        check("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", Err("the headers never end"));
        check("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n[]", Err("the body is 2 bytes; Content-Length says 5"));
        check("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", Err("Content-Length \"x\" is not a number"));
        check("SSH-2.0-OpenSSH\r\n\r\n", Err("status line \"SSH-2.0-OpenSSH\" is not HTTP/1.x"));
        check("HTTP/1.1 OK\r\n\r\n", Err("status line \"HTTP/1.1 OK\" has no status code"));
        check("HTTP/1.1 200 OK\r\nBroken\r\n\r\n", Err("header line \"Broken\" has no colon"));
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort\r\n", Err("a chunk of 16 bytes is cut short"));
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", Err("chunk size \"zz\" is not hexadecimal"));
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n", Err("a chunk of 2 bytes does not end with CRLF"));
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", Err("a chunk size line never ends"));
    }

    #[test]
    fn requests_on_the_wire() {
        let request = Request::with_body(Method::Post, "/api/v1/drives/3/state", &serde_json::json!({"state": "good"}));
        let expected = "POST /api/v1/drives/3/state HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                        Accept: application/json\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{\"state\":\"good\"}";
        assert_eq!(String::from_utf8(request.encode("localhost")).unwrap(), expected);
        let get = String::from_utf8(Request::get("/api/v1/vds").encode("127.0.0.1:9090")).unwrap();
        assert!(get.starts_with("GET /api/v1/vds HTTP/1.1\r\nHost: 127.0.0.1:9090\r\n"));
        assert!(get.ends_with("Content-Length: 0\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn tokens_for_tcp() {
        let hex = "0123456789abcdef".repeat(4);
        let request = Request::get("/api/v1/vds").encode_with_token("127.0.0.1:9090", Some(&hex));
        let text = String::from_utf8(request).unwrap();
        assert!(
            text.starts_with(&format!("GET /api/v1/vds HTTP/1.1\r\nHost: 127.0.0.1:9090\r\nAuthorization: Bearer {hex}\r\n")),
            "{text}"
        );
        let absent = Path::new("/nonexistent-storc-dir/api.token");
        assert_eq!(api_token(Some(format!("{hex}\n")), absent), Ok(Some(hex.clone())));
        assert_eq!(api_token(None, absent), Ok(None));
        assert_eq!(api_token(Some(String::new()), absent), Ok(None));
        assert_eq!(
            api_token(Some("abc\r\nX-Injected: 1".into()), absent),
            Err("STORC_API_TOKEN does not hold an API token (hex digits, as storc serve writes to <data-dir>/api.token)".into())
        );
        let dir = std::env::temp_dir().join(format!("storc-cli-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("api.token"), format!("{hex}\n")).unwrap();
        assert_eq!(api_token(None, &dir.join("api.token")), Ok(Some(hex.clone())));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn endpoints() {
        let strings = |items: &[&str]| items.iter().map(|item| item.to_string()).collect::<Vec<_>>();
        let api = |value: &str| ApiSettings { api: Some(value.to_string()), ca: None };
        let mut args = strings(&["/c0", "--api", "/run/a.sock", "show"]);
        assert_eq!(take_api_options(&mut args), Ok(api("/run/a.sock")));
        assert_eq!(args, strings(&["/c0", "show"]));
        let mut args = strings(&["--api=tcp:127.0.0.1:9090", "/c0", "show", "J"]);
        assert_eq!(take_api_options(&mut args), Ok(api("tcp:127.0.0.1:9090")));
        assert_eq!(args, strings(&["/c0", "show", "J"]));
        let mut args = strings(&["/c0", "--api-ca", "ca.pem", "show", "--api=https://127.0.0.1:8443"]);
        let https = ApiSettings { api: Some("https://127.0.0.1:8443".into()), ca: Some("ca.pem".into()) };
        assert_eq!(take_api_options(&mut args), Ok(https.clone()));
        assert_eq!(args, strings(&["/c0", "show"]));
        let mut args = strings(&["/c0", "show", "--api"]);
        assert_eq!(take_api_options(&mut args), Err("--api needs a socket path, tcp:HOST:PORT or https://HOST:PORT".to_string()));
        let mut args = strings(&["/c0", "show", "--api-ca"]);
        assert_eq!(take_api_options(&mut args), Err("--api-ca needs a file of PEM CA certificates".to_string()));

        let none = ApiSettings::default;
        assert_eq!(Endpoint::choose(none(), none()), Ok(Endpoint::Unix(PathBuf::from(API_SOCKET_DEFAULT))));
        assert_eq!(Endpoint::choose(none(), api("/env.sock")), Ok(Endpoint::Unix(PathBuf::from("/env.sock"))));
        assert_eq!(Endpoint::choose(api("tcp:127.0.0.1:9090"), api("/env.sock")), Ok(Endpoint::Tcp("127.0.0.1:9090".into())));
        assert_eq!(Endpoint::Tcp("127.0.0.1:9090".into()).to_string(), "tcp:127.0.0.1:9090");
        let chosen = Endpoint::choose(https.clone(), none()).unwrap();
        assert_eq!(chosen, Endpoint::Https(HttpsEndpoint::parse("127.0.0.1:8443", Some("ca.pem".into())).unwrap()));
        assert_eq!(chosen.to_string(), "https://127.0.0.1:8443");
        // The environment's CA goes with an https endpoint; beside another endpoint it is ignored.
        let env_ca = ApiSettings { api: Some("https://[::1]:8443".into()), ca: Some("env-ca.pem".into()) };
        assert_eq!(
            Endpoint::choose(none(), env_ca.clone()),
            Ok(Endpoint::Https(HttpsEndpoint::parse("[::1]:8443", Some("env-ca.pem".into())).unwrap()))
        );
        assert_eq!(Endpoint::choose(api("/a.sock"), env_ca), Ok(Endpoint::Unix(PathBuf::from("/a.sock"))));
        let stray = ApiSettings { api: Some("tcp:127.0.0.1:9090".into()), ca: Some("ca.pem".into()) };
        assert_eq!(
            Endpoint::choose(stray, none()),
            Err("--api-ca ca.pem applies to an HTTPS endpoint, and the endpoint is tcp:127.0.0.1:9090; allowed: --api-ca FILE with --api https://HOST:PORT".into())
        );
    }

    #[test]
    fn an_absent_socket_says_how_to_start_the_daemon() {
        let endpoint = Endpoint::Unix(PathBuf::from("/nonexistent-storc-dir/api.sock"));
        let error = send(&endpoint, &Request::get("/api/v1/controller")).unwrap_err();
        assert_eq!(
            error,
            "cannot reach the storc daemon at /nonexistent-storc-dir/api.sock (No such file or directory); start it with: storc serve"
        );
    }
}
