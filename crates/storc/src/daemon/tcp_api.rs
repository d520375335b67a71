//! The rules of the management API over TCP, where file permissions protect nothing.
//!
//! - The Host header must name the listener itself. A web page under another name that the
//!   attacker's DNS points at 127.0.0.1 (DNS rebinding) sends its own name as Host, so it is
//!   refused before it reaches a handler.
//! - The client's socket must belong to the daemon's user or root. Any local user can connect to
//!   a loopback port; the kernel's socket table says who did (see `peer_uid`).
//! - The request must carry the API token (`api_token`): a process of the same user that cannot
//!   read the data directory (a sandboxed one, a browser tab) gets no further. Only the console's
//!   page, its script and style, and its login and logout (`console::PUBLIC_PATHS`) answer
//!   without it: the page is the same for everyone and holds nothing of the controller.
//!
//! A refused request reaches no handler, so it changes nothing. The Unix socket needs none of
//! these rules: it is owner-only in an owner-only directory, and clients such as curl send
//! `Host: localhost` there.
//!
//! One exception, asked for with `--metrics-any-user`: `GET /metrics` (read-only: states, names,
//! counters) answers every local user without the token, so that a Prometheus running as its
//! own user can scrape it. The Host rule still applies to it; every other route keeps the owner
//! and token rules.

use super::api_token::{ApiToken, Presented};
use super::peer_uid;
use crate::api_types::ApiError;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use axum::Json;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

const ROOT_UID: u32 = 0;

/// Both ends of one TCP connection, taken when it is accepted.
#[derive(Clone, Copy, Debug)]
pub struct TcpConnection {
    pub peer: SocketAddr,
    /// Our end; `None` if the kernel could not say (the connection is then refused).
    pub local: Option<SocketAddr>,
}

impl Connected<IncomingStream<'_, TcpListener>> for TcpConnection {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        TcpConnection { peer: *stream.remote_addr(), local: stream.io().local_addr().ok() }
    }
}

/// What a TCP request must match.
pub struct TcpRules {
    /// `127.0.0.1:9090`, `localhost:9090` (lower case); without the port too when it is 80.
    allowed_hosts: Vec<String>,
    allowed_uids: Vec<u32>,
    /// `GET /metrics` skips the owner and token rules (`--metrics-any-user`).
    metrics_any_user: bool,
    token: Arc<ApiToken>,
}

impl TcpRules {
    /// The rules for a listener bound to `listen`, in a daemon running as `daemon_uid`.
    pub fn new(listen: SocketAddr, daemon_uid: u32, metrics_any_user: bool, token: Arc<ApiToken>) -> TcpRules {
        let mut allowed_hosts = vec![listen.to_string(), format!("localhost:{}", listen.port())];
        if listen.port() == 80 {
            // HTTP clients leave out the default port.
            let bare_ip = match listen {
                SocketAddr::V4(v4) => v4.ip().to_string(),
                SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            };
            allowed_hosts.extend([bare_ip, "localhost".to_string()]);
        }
        let mut allowed_uids = vec![daemon_uid, ROOT_UID];
        allowed_uids.dedup();
        TcpRules { allowed_hosts, allowed_uids, metrics_any_user, token }
    }

    /// Whether `request` may skip the owner and token rules: a metrics scrape, when they are
    /// open to all.
    fn open_to_any_user(&self, request: &Request) -> bool {
        self.metrics_any_user && request.method() == axum::http::Method::GET && request.uri().path() == "/metrics"
    }
    /// Ok if the request carries the token or needs none, or the 401 that says where it is.
    pub fn check_token(&self, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
        if super::console::PUBLIC_PATHS.contains(&path) {
            return Ok(());
        }
        let why = match self.token.presented_in(headers) {
            Presented::Token => return Ok(()),
            Presented::Nothing => "this request carries no API token",
            Presented::WrongToken => "this request's API token is not this daemon's",
        };
        Err(Refusal::unauthorized(format!(
            "{why}; the management API over TCP needs the token in {} as `Authorization: Bearer TOKEN` \
             (the CLI sends STORC_API_TOKEN; the console logs in with it)",
            self.token.path().display()
        )))
    }

    /// Ok, or the refusal that names the Host received and the ones allowed.
    pub fn check_host(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let allowed = self.allowed_hosts.join(", ");
        let host = match headers.get(header::HOST).map(|value| value.to_str()) {
            None => return Err(Refusal::misdirected(format!("the request has no Host header; allowed: {allowed}"))),
            Some(Err(_)) => return Err(Refusal::misdirected(format!("the Host header is not text; allowed: {allowed}"))),
            Some(Ok(host)) => host.trim(),
        };
        if self.allowed_hosts.iter().any(|name| name.eq_ignore_ascii_case(host)) {
            return Ok(());
        }
        Err(Refusal::misdirected(format!(
            "Host {host:?} is not this API's address; allowed: {allowed} (a page under another name, e.g. through DNS rebinding, cannot use the API)"
        )))
    }

    /// Ok if the client's socket belongs to an allowed user, or the refusal naming its uid.
    pub fn check_owner(&self, connection: TcpConnection) -> Result<(), Refusal> {
        let allowed = self.allowed_uids.iter().map(|uid| uid.to_string()).collect::<Vec<_>>().join(" and ");
        let local = connection.local.ok_or_else(|| Refusal::forbidden("cannot tell this connection's local address; refused".into()))?;
        match peer_uid::peer_uid(connection.peer, local) {
            Ok(Some(uid)) if self.allowed_uids.contains(&uid) => Ok(()),
            Ok(Some(uid)) => Err(Refusal::forbidden(format!(
                "the connection from {} belongs to uid {uid}; the management API over TCP answers only uid {allowed} (the daemon's user and root)",
                connection.peer
            ))),
            Ok(None) => Err(Refusal::forbidden(format!("no socket of {} in the kernel's TCP table; cannot tell its user; refused", connection.peer))),
            Err(error) => Err(Refusal::forbidden(format!("cannot tell which user owns the connection from {} ({error}); refused", connection.peer))),
        }
    }
}

/// A request refused before any handler ran: nothing was changed.
#[derive(Debug)]
pub struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn misdirected(message: String) -> Refusal {
        Refusal { status: StatusCode::MISDIRECTED_REQUEST, message }
    }

    fn forbidden(message: String) -> Refusal {
        Refusal { status: StatusCode::FORBIDDEN, message }
    }

    fn unauthorized(message: String) -> Refusal {
        Refusal { status: StatusCode::UNAUTHORIZED, message }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ApiError { error: self.message })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 9110 11.6.1: a 401 names the scheme it wants.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"storc\""));
        }
        response
    }
}

/// The middleware of the TCP router: Host first (it needs no system call), then the owner (so
/// that another user learns nothing, not even whether a token is wanted), then the token.
pub async fn guard(
    State(rules): State<Arc<TcpRules>>,
    ConnectInfo(connection): ConnectInfo<TcpConnection>,
    request: Request,
    next: Next,
) -> Response {
    let checked = match rules.check_host(request.headers()) {
        Ok(()) if rules.open_to_any_user(&request) => return next.run(request).await,
        Ok(()) => check_owner_off_runtime(Arc::clone(&rules), connection).await,
        Err(refusal) => Err(refusal),
    };
    let checked = checked.and_then(|()| rules.check_token(request.uri().path(), request.headers()));
    match checked {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(peer = %connection.peer, "management API over TCP: refused: {}", refusal.message);
            refusal.into_response()
        }
    }
}

/// The socket tables grow with every connection on the host; reading them on the blocking pool
/// keeps the single-threaded control-plane runtime (and the Unix socket API) answering meanwhile.
async fn check_owner_off_runtime(rules: Arc<TcpRules>, connection: TcpConnection) -> Result<(), Refusal> {
    match tokio::task::spawn_blocking(move || rules.check_owner(connection)).await {
        Ok(checked) => checked,
        Err(join) => {
            Err(Refusal::forbidden(format!("the owner check of the connection from {} failed ({join}); refused", connection.peer)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn test_token() -> Arc<ApiToken> {
        Arc::new(ApiToken::for_tests("0123456789abcdef".repeat(4)))
    }

    fn check(listen: &str, host: Option<&str>, expected: Result<(), &str>) {
        let rules = TcpRules::new(listen.parse().unwrap(), 1000, false, test_token());
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        let outcome = rules.check_host(&headers).map_err(|refusal| {
            assert_eq!(refusal.status, StatusCode::MISDIRECTED_REQUEST);
            refusal.message
        });
        assert_eq!(outcome, expected.map_err(str::to_string), "listening on {listen}, Host {host:?}");
    }

    #[test]
    fn hosts() {
        check("127.0.0.1:9090", Some("127.0.0.1:9090"), Ok(()));
        check("127.0.0.1:9090", Some("LocalHost:9090"), Ok(()));
        check("[::1]:9090", Some("[::1]:9090"), Ok(()));
        check("[::1]:9090", Some("localhost:9090"), Ok(()));
        check("127.0.0.1:80", Some("127.0.0.1"), Ok(()));
        check("127.0.0.1:80", Some("localhost"), Ok(()));
        check(
            "127.0.0.1:9090",
            Some("evil.example:9090"),
            Err("Host \"evil.example:9090\" is not this API's address; allowed: 127.0.0.1:9090, localhost:9090 \
                 (a page under another name, e.g. through DNS rebinding, cannot use the API)"),
        );
        check(
            "127.0.0.1:9090",
            Some("127.0.0.1:9091"),
            Err("Host \"127.0.0.1:9091\" is not this API's address; allowed: 127.0.0.1:9090, localhost:9090 \
                 (a page under another name, e.g. through DNS rebinding, cannot use the API)"),
        );
        check("127.0.0.1:9090", Some("127.0.0.1"), Err("Host \"127.0.0.1\" is not this API's address; allowed: 127.0.0.1:9090, localhost:9090 (a page under another name, e.g. through DNS rebinding, cannot use the API)"));
        check("127.0.0.1:9090", None, Err("the request has no Host header; allowed: 127.0.0.1:9090, localhost:9090"));
    }

    #[test]
    fn only_a_metrics_get_skips_the_owner_rule_and_only_when_asked() {
        let request = |method: &str, uri: &str| Request::builder().method(method).uri(uri).body(axum::body::Body::empty()).unwrap();
        let open = TcpRules::new("127.0.0.1:9090".parse().unwrap(), 1000, true, test_token());
        assert!(open.open_to_any_user(&request("GET", "/metrics")));
        assert!(open.open_to_any_user(&request("GET", "/metrics?name=x")));
        for (method, uri) in [("POST", "/metrics"), ("GET", "/metrics/"), ("GET", "/api/v1/controller"), ("DELETE", "/api/v1/vds/0")] {
            assert!(!open.open_to_any_user(&request(method, uri)), "{method} {uri}");
        }
        let closed = TcpRules::new("127.0.0.1:9090".parse().unwrap(), 1000, false, test_token());
        assert!(!closed.open_to_any_user(&request("GET", "/metrics")));
    }

    #[test]
    fn owners() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let connection = TcpConnection { peer, local: Some(accepted.local_addr().unwrap()) };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(TcpRules::new(listener.local_addr().unwrap(), uid, false, test_token()).check_owner(connection).is_ok());
        let other_uid = uid + 4242;
        let rules_of_another_user =
            TcpRules { allowed_hosts: Vec::new(), allowed_uids: vec![other_uid], metrics_any_user: false, token: test_token() };
        let refusal = rules_of_another_user.check_owner(connection).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(refusal.message.contains(&format!("belongs to uid {uid}")), "{}", refusal.message);
        let gone = TcpConnection { peer: "127.0.0.1:1".parse().unwrap(), local: connection.local };
        assert!(TcpRules::new(listener.local_addr().unwrap(), uid, false, test_token()).check_owner(gone).is_err());
    }

    #[test]
    fn tokens() {
        let rules = TcpRules::new("127.0.0.1:9090".parse().unwrap(), 1000, false, test_token());
        let mut with_token = HeaderMap::new();
        with_token.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {}", "0123456789abcdef".repeat(4))).unwrap());
        assert!(rules.check_token("/api/v1/controller", &with_token).is_ok());
        let refusal = rules.check_token("/api/v1/controller", &HeaderMap::new()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNAUTHORIZED);
        assert!(refusal.message.starts_with("this request carries no API token; the management API over TCP needs the token in "));
        let response = refusal.into_response();
        assert_eq!(response.headers().get(header::WWW_AUTHENTICATE).unwrap(), "Bearer realm=\"storc\"");
        let mut wrong = HeaderMap::new();
        wrong.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer 00"));
        assert!(rules.check_token("/api/v1/vds", &wrong).unwrap_err().message.starts_with("this request's API token is not this daemon's"));
        // The console's page and its login answer without one; nothing else does.
        for public in ["/", "/console.js", "/charts.js", "/console.css", "/console/login", "/console/logout"] {
            assert!(rules.check_token(public, &HeaderMap::new()).is_ok(), "{public}");
        }
        for private in ["/api/v1/vds", "/console", "/console.js/x", "/favicon.ico", "//"] {
            assert!(rules.check_token(private, &HeaderMap::new()).is_err(), "{private}");
        }
    }
}
