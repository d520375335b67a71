//! The rules of the management API over TCP, where file permissions protect nothing.
//!
//! - The Host header must name the listener itself. A web page under another name that the
//!   attacker's DNS points at 127.0.0.1 (DNS rebinding) sends its own name as Host, so it is
//!   refused before it reaches a handler.
//! - The client's socket must belong to the daemon's user or root. Any local user can connect to
//!   a loopback port; the kernel's socket table says who did (see `peer_uid`).
//!
//! The Unix socket needs neither rule: it is owner-only in an owner-only directory, and clients
//! such as curl send `Host: localhost` there.
//!
//! One exception, asked for with `--metrics-any-user`: `GET /metrics` (read-only: states, names,
//! counters) answers every local user, so that a Prometheus running as its own user can scrape
//! it. The Host rule still applies to it, and every other route keeps the owner rule.

use super::peer_uid;
use crate::api_types::ApiError;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
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
    /// `GET /metrics` skips the owner rule (`--metrics-any-user`).
    metrics_any_user: bool,
}

impl TcpRules {
    /// The rules for a listener bound to `listen`, in a daemon running as `daemon_uid`.
    pub fn new(listen: SocketAddr, daemon_uid: u32, metrics_any_user: bool) -> TcpRules {
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
        TcpRules { allowed_hosts, allowed_uids, metrics_any_user }
    }

    /// Whether `request` may skip the owner rule: a metrics scrape, when they are open to all.
    fn open_to_any_user(&self, request: &Request) -> bool {
        self.metrics_any_user && request.method() == axum::http::Method::GET && request.uri().path() == "/metrics"
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
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, Json(ApiError { error: self.message })).into_response()
    }
}

/// The middleware of the TCP router: Host first (it needs no system call), then the owner.
pub async fn guard(
    State(rules): State<Arc<TcpRules>>,
    ConnectInfo(connection): ConnectInfo<TcpConnection>,
    request: Request,
    next: Next,
) -> Response {
    let checked = match rules.check_host(request.headers()) {
        Ok(()) if rules.open_to_any_user(&request) => Ok(()),
        Ok(()) => check_owner_off_runtime(rules, connection).await,
        Err(refusal) => Err(refusal),
    };
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

    fn check(listen: &str, host: Option<&str>, expected: Result<(), &str>) {
        let rules = TcpRules::new(listen.parse().unwrap(), 1000, false);
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
        let open = TcpRules::new("127.0.0.1:9090".parse().unwrap(), 1000, true);
        assert!(open.open_to_any_user(&request("GET", "/metrics")));
        assert!(open.open_to_any_user(&request("GET", "/metrics?name=x")));
        for (method, uri) in [("POST", "/metrics"), ("GET", "/metrics/"), ("GET", "/api/v1/controller"), ("DELETE", "/api/v1/vds/0")] {
            assert!(!open.open_to_any_user(&request(method, uri)), "{method} {uri}");
        }
        let closed = TcpRules::new("127.0.0.1:9090".parse().unwrap(), 1000, false);
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
        assert!(TcpRules::new(listener.local_addr().unwrap(), uid, false).check_owner(connection).is_ok());
        let other_uid = uid + 4242;
        let rules_of_another_user = TcpRules { allowed_hosts: Vec::new(), allowed_uids: vec![other_uid], metrics_any_user: false };
        let refusal = rules_of_another_user.check_owner(connection).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(refusal.message.contains(&format!("belongs to uid {uid}")), "{}", refusal.message);
        let gone = TcpConnection { peer: "127.0.0.1:1".parse().unwrap(), local: connection.local };
        assert!(TcpRules::new(listener.local_addr().unwrap(), uid, false).check_owner(gone).is_err());
    }
}
