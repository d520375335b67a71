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
//!
//! # A listener opened to the network (`--api-listen-any`, with HTTPS: `api_listen`)
//!
//! The owner rule can only be applied to local clients: the kernel's socket table names the user
//! of every socket of this network namespace, and of nothing beyond it. So a client is looked up
//! whatever its address (a local user reaching the listener through the machine's network
//! address is found and judged like one on loopback), and only a client that is not in the
//! table, from a non-loopback address, to a listener opened to the network on purpose, passes
//! the owner rule as *remote*: the token alone decides for it. A loopback client that is not
//! in the table (it has already gone) is still refused. `--metrics-any-user` then opens
//! `/metrics` to every local user only; a remote scraper shows the token.
//!
//! The Host rule accepts the listener's address, `localhost`, the address the client actually
//! connected to (the same unless the listener is bound to a wildcard address), the name given to
//! `--api-listen`, and with HTTPS the DNS names of the server's certificate (the names a client
//! can verify it under), each with the port, and without it when the port is the scheme's
//! default (80, or 443 for HTTPS).

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
use std::net::{IpAddr, SocketAddr};
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

/// What the rules need to know of the listener.
#[derive(Clone, Debug, Default)]
pub struct ListenerFacts {
    /// The address it is bound to.
    pub bound: Option<SocketAddr>,
    /// Further names a Host may give: the `--api-listen` name, the certificate's DNS names.
    pub names: Vec<String>,
    /// HTTPS (the default port is then 443).
    pub https: bool,
    /// `--api-listen-any`: clients that are not local pass the owner rule (the token decides).
    pub network_open: bool,
}

/// Who owns the client's end of a connection, as far as the kernel can say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerOwner {
    /// A local socket of this user.
    Uid(u32),
    /// Not a socket of this machine's network namespace, on a listener opened to the network.
    Remote,
}

/// What a TCP request must match.
pub struct TcpRules {
    /// `127.0.0.1:9090`, `localhost:9090` (lower case); without the port too when it is the
    /// scheme's default.
    allowed_hosts: Vec<String>,
    default_port: u16,
    allowed_uids: Vec<u32>,
    /// `GET /metrics` skips the owner and token rules (`--metrics-any-user`).
    metrics_any_user: bool,
    network_open: bool,
    token: Arc<ApiToken>,
}

impl TcpRules {
    /// The rules for the listener `facts` describes, in a daemon running as `daemon_uid`.
    pub fn new(facts: &ListenerFacts, daemon_uid: u32, metrics_any_user: bool, token: Arc<ApiToken>) -> TcpRules {
        let default_port = if facts.https { HTTPS_DEFAULT_PORT } else { HTTP_DEFAULT_PORT };
        let mut names: Vec<String> =
            facts.bound.iter().filter(|bound| !bound.ip().is_unspecified()).map(|bound| host_text(bound.ip())).collect();
        names.push("localhost".to_string());
        names.extend(facts.names.iter().map(|name| name.to_ascii_lowercase()));
        let mut allowed_hosts = Vec::new();
        if let Some(port) = facts.bound.map(|bound| bound.port()) {
            allowed_hosts.extend(names.iter().map(|name| format!("{name}:{port}")));
            if port == default_port {
                // HTTP clients leave out the default port.
                allowed_hosts.extend(names.iter().cloned());
            }
        }
        dedup_keeping_order(&mut allowed_hosts);
        let mut allowed_uids = vec![daemon_uid, ROOT_UID];
        allowed_uids.dedup();
        TcpRules { allowed_hosts, default_port, allowed_uids, metrics_any_user, network_open: facts.network_open, token }
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

    /// Ok, or the refusal that names the Host received and the ones allowed; `local` is our end
    /// of the connection (its address is a Host the client may use).
    pub fn check_host(&self, headers: &HeaderMap, local: Option<SocketAddr>) -> Result<(), Refusal> {
        let mut allowed_hosts = self.allowed_hosts.clone();
        if let Some(local) = local {
            allowed_hosts.push(format!("{}:{}", host_text(local.ip()), local.port()));
            if local.port() == self.default_port {
                allowed_hosts.push(host_text(local.ip()));
            }
            dedup_keeping_order(&mut allowed_hosts);
        }
        let allowed = allowed_hosts.join(", ");
        let host = match headers.get(header::HOST).map(|value| value.to_str()) {
            None => return Err(Refusal::misdirected(format!("the request has no Host header; allowed: {allowed}"))),
            Some(Err(_)) => return Err(Refusal::misdirected(format!("the Host header is not text; allowed: {allowed}"))),
            Some(Ok(host)) => host.trim(),
        };
        if allowed_hosts.iter().any(|name| name.eq_ignore_ascii_case(host)) {
            return Ok(());
        }
        Err(Refusal::misdirected(format!(
            "Host {host:?} is not this API's address; allowed: {allowed} (a page under another name, e.g. through DNS rebinding, cannot use the API)"
        )))
    }

    /// Who owns the client's socket, or the refusal when that cannot be told and must be.
    pub fn peer_owner(&self, connection: TcpConnection) -> Result<PeerOwner, Refusal> {
        let local = connection.local.ok_or_else(|| Refusal::forbidden("cannot tell this connection's local address; refused".into()))?;
        match peer_uid::peer_uid(connection.peer, local) {
            Ok(Some(uid)) => Ok(PeerOwner::Uid(uid)),
            Ok(None) if self.network_open && !connection.peer.ip().to_canonical().is_loopback() => Ok(PeerOwner::Remote),
            Ok(None) => Err(Refusal::forbidden(format!(
                "no socket of {} in the kernel's TCP table; cannot tell its user; refused",
                connection.peer
            ))),
            Err(error) => {
                Err(Refusal::forbidden(format!("cannot tell which user owns the connection from {} ({error}); refused", connection.peer)))
            }
        }
    }

    /// Ok if the client's socket belongs to an allowed user or is remote on a listener opened to
    /// the network, or the refusal naming its uid. (The guard looks the owner up once itself.)
    #[cfg(test)]
    pub fn check_owner(&self, connection: TcpConnection) -> Result<(), Refusal> {
        self.check_owner_of(self.peer_owner(connection)?, connection)
    }

    /// `check_owner` with the owner already looked up.
    fn check_owner_of(&self, owner: PeerOwner, connection: TcpConnection) -> Result<(), Refusal> {
        match owner {
            PeerOwner::Uid(uid) if !self.allowed_uids.contains(&uid) => {
                let allowed = self.allowed_uids.iter().map(|uid| uid.to_string()).collect::<Vec<_>>().join(" and ");
                Err(Refusal::forbidden(format!(
                    "the connection from {} belongs to uid {uid}; the management API over TCP answers only uid {allowed} (the daemon's user and root)",
                    connection.peer
                )))
            }
            PeerOwner::Uid(_) | PeerOwner::Remote => Ok(()),
        }
    }
}

const HTTP_DEFAULT_PORT: u16 = 80;
const HTTPS_DEFAULT_PORT: u16 = 443;

/// An address as a Host header names it: `10.0.0.1`, `[::1]` (an IPv4 client of a dual-stack
/// socket as its IPv4 address).
fn host_text(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn dedup_keeping_order(names: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
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
    let metrics_scrape = rules.open_to_any_user(&request);
    let checked = match rules.check_host(request.headers(), connection.local) {
        // Only local users can be told from others: with the network open, this needs the lookup.
        Ok(()) if metrics_scrape && !rules.network_open => return next.run(request).await,
        Ok(()) => peer_owner_off_runtime(Arc::clone(&rules), connection).await,
        Err(refusal) => Err(refusal),
    };
    let checked = checked.and_then(|owner| match owner {
        PeerOwner::Uid(_) if metrics_scrape => Ok(()),
        _ => rules.check_owner_of(owner, connection).and_then(|()| rules.check_token(request.uri().path(), request.headers())),
    });
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
async fn peer_owner_off_runtime(rules: Arc<TcpRules>, connection: TcpConnection) -> Result<PeerOwner, Refusal> {
    match tokio::task::spawn_blocking(move || rules.peer_owner(connection)).await {
        Ok(owner) => owner,
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

    /// A plaintext loopback listener's facts.
    fn loopback(listen: &str) -> ListenerFacts {
        ListenerFacts { bound: Some(listen.parse().unwrap()), ..ListenerFacts::default() }
    }

    fn check(listen: &str, host: Option<&str>, expected: Result<(), &str>) {
        let facts = loopback(listen);
        check_with(&facts, facts.bound, host, expected);
    }

    fn check_with(facts: &ListenerFacts, local: Option<SocketAddr>, host: Option<&str>, expected: Result<(), &str>) {
        let rules = TcpRules::new(facts, 1000, false, test_token());
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        let outcome = rules.check_host(&headers, local).map_err(|refusal| {
            assert_eq!(refusal.status, StatusCode::MISDIRECTED_REQUEST);
            refusal.message
        });
        assert_eq!(outcome, expected.map_err(str::to_string), "listening as {facts:?} on {local:?}, Host {host:?}");
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
    fn hosts_of_an_https_listener_open_to_the_network() {
        let names = vec!["storc.example".to_string(), "Console.Example".to_string()];
        let facts = ListenerFacts { bound: Some("0.0.0.0:8443".parse().unwrap()), names, https: true, network_open: true };
        let local = Some("10.78.0.1:8443".parse().unwrap());
        for host in ["10.78.0.1:8443", "storc.example:8443", "console.example:8443", "localhost:8443"] {
            check_with(&facts, local, Some(host), Ok(()));
        }
        // A client of a dual-stack socket has an IPv4-mapped local address; it names the IPv4 one.
        check_with(&facts, Some("[::ffff:10.78.0.1]:8443".parse().unwrap()), Some("10.78.0.1:8443"), Ok(()));
        check_with(
            &facts,
            local,
            Some("10.78.0.2:8443"),
            Err("Host \"10.78.0.2:8443\" is not this API's address; allowed: localhost:8443, storc.example:8443, console.example:8443, \
                 10.78.0.1:8443 (a page under another name, e.g. through DNS rebinding, cannot use the API)"),
        );
        check_with(&facts, local, Some("0.0.0.0:8443"), Err("Host \"0.0.0.0:8443\" is not this API's address; allowed: localhost:8443, storc.example:8443, console.example:8443, 10.78.0.1:8443 (a page under another name, e.g. through DNS rebinding, cannot use the API)"));
        // HTTPS on 443: clients leave the port out.
        let on_443 = ListenerFacts {
            bound: Some("10.78.0.1:443".parse().unwrap()),
            names: vec!["storc.example".into()],
            https: true,
            network_open: true,
        };
        for host in ["10.78.0.1", "storc.example", "10.78.0.1:443"] {
            check_with(&on_443, on_443.bound, Some(host), Ok(()));
        }
        let plain_443 = loopback("127.0.0.1:443");
        assert!(TcpRules::new(&plain_443, 1000, false, test_token()).allowed_hosts.iter().all(|host| host.ends_with(":443")));
    }

    #[test]
    fn only_a_metrics_get_skips_the_owner_rule_and_only_when_asked() {
        let request = |method: &str, uri: &str| Request::builder().method(method).uri(uri).body(axum::body::Body::empty()).unwrap();
        let open = TcpRules::new(&loopback("127.0.0.1:9090"), 1000, true, test_token());
        assert!(open.open_to_any_user(&request("GET", "/metrics")));
        assert!(open.open_to_any_user(&request("GET", "/metrics?name=x")));
        for (method, uri) in [("POST", "/metrics"), ("GET", "/metrics/"), ("GET", "/api/v1/controller"), ("DELETE", "/api/v1/vds/0")] {
            assert!(!open.open_to_any_user(&request(method, uri)), "{method} {uri}");
        }
        let closed = TcpRules::new(&loopback("127.0.0.1:9090"), 1000, false, test_token());
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
        let facts = ListenerFacts { bound: Some(listener.local_addr().unwrap()), ..ListenerFacts::default() };
        assert!(TcpRules::new(&facts, uid, false, test_token()).check_owner(connection).is_ok());
        let other_uid = uid + 4242;
        let mut rules_of_another_user = TcpRules::new(&facts, uid, false, test_token());
        rules_of_another_user.allowed_uids = vec![other_uid];
        let refusal = rules_of_another_user.check_owner(connection).unwrap_err();
        assert_eq!(refusal.status, StatusCode::FORBIDDEN);
        assert!(refusal.message.contains(&format!("belongs to uid {uid}")), "{}", refusal.message);
        // Opened to the network, a local user is still judged by its uid.
        let network = ListenerFacts { network_open: true, ..facts.clone() };
        let mut open_rules_of_another_user = TcpRules::new(&network, uid, false, test_token());
        open_rules_of_another_user.allowed_uids = vec![other_uid];
        assert!(open_rules_of_another_user.check_owner(connection).is_err());
        // A client the table does not hold: refused, unless it is remote and the network is open.
        let gone = TcpConnection { peer: "127.0.0.1:1".parse().unwrap(), local: connection.local };
        assert!(TcpRules::new(&facts, uid, false, test_token()).check_owner(gone).is_err());
        assert!(TcpRules::new(&network, uid, false, test_token()).check_owner(gone).is_err(), "a loopback client is never remote");
        let remote = TcpConnection { peer: "192.0.2.77:40000".parse().unwrap(), local: connection.local };
        assert!(TcpRules::new(&facts, uid, false, test_token()).check_owner(remote).is_err());
        assert_eq!(TcpRules::new(&network, uid, false, test_token()).peer_owner(remote).unwrap(), PeerOwner::Remote);
    }

    #[test]
    fn tokens() {
        let rules = TcpRules::new(&loopback("127.0.0.1:9090"), 1000, false, test_token());
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
