//! The management API's TCP listener: `--api-listen ADDRESS`, `--api-listen-any` and
//! `--api-tls-certificates DIR`, checked before anything is created, and the listener itself
//! (plain HTTP, or HTTPS through `api_tls`) behind the rules of `tcp_api`.
//!
//! Loopback unless asked: an address that resolves anywhere else is refused unless the
//! administrator gives `--api-listen-any` (on purpose) *and* `--api-tls-certificates` (the
//! token must never cross a network in plaintext). What is then allowed past the owner rule is
//! in `tcp_api`: remote clients need the token, local ones are still judged by their user.

use super::api_tls::{self, ApiTls};
use super::tcp_api::{self, ListenerFacts, TcpConnection, TcpRules};
use super::{api_token::ApiToken, console};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ApiListenArgs {
    /// Lets --api-listen take an address that is not loopback (e.g. 0.0.0.0:8443 or the
    /// machine's address): the management API and the console become reachable from the network.
    /// Needs --api-tls-certificates. Clients from the network need the token; local ones are
    /// still only the daemon's user and root.
    #[arg(long)]
    api_listen_any: bool,
    /// HTTPS on the TCP management listener: a directory holding server-cert.pem (the server's
    /// certificate, PEM, its chain after it) and server-key.pem, as for --tls-certificates.
    /// The listener then speaks only HTTPS; clients verify it against the CA that signed it
    /// (storc --api https://HOST:PORT --api-ca ca-cert.pem) and show the token, no certificate.
    #[arg(long, value_name = "DIR")]
    api_tls_certificates: Option<PathBuf>,
}

/// The TCP listener as checked: where it binds and how it speaks.
pub struct ApiListen {
    pub address: SocketAddr,
    /// `--api-listen` as given (a name is a Host clients may use).
    given: String,
    tls: Option<ApiTls>,
    /// `--api-listen-any`.
    network_open: bool,
}

const LOOPBACK_ALLOWED: &str = "allowed: an address in 127.0.0.0/8, [::1] or localhost, with a port (e.g. 127.0.0.1:8080)";
const NETWORK_FLAGS: &str = "--api-listen-any and --api-tls-certificates DIR";

impl ApiListenArgs {
    /// The listener `--api-listen` asks for, checked and with its certificate loaded: `None`
    /// without `--api-listen`.
    ///
    /// # Errors
    /// The address does not resolve, or resolves beyond loopback without both network flags; a
    /// network flag without `--api-listen`; certificates that do not load.
    pub fn resolve(&self, api_listen: Option<&str>) -> Result<Option<ApiListen>, String> {
        let Some(given) = api_listen else {
            let stray = [("--api-listen-any", self.api_listen_any), ("--api-tls-certificates", self.api_tls_certificates.is_some())];
            if let Some((flag, _)) = stray.iter().find(|(_, is_given)| *is_given) {
                return Err(format!(
                    "{flag} applies to the TCP management listener, which is off; allowed: {flag} with --api-listen ADDRESS"
                ));
            }
            return Ok(None);
        };
        let resolved: Vec<SocketAddr> = given
            .to_socket_addrs()
            .map_err(|error| {
                format!(
                    "--api-listen {given}: cannot resolve it ({error}); without {NETWORK_FLAGS} the management API serves on \
                     loopback only; {LOOPBACK_ALLOWED}; any HOST:PORT with both flags"
                )
            })?
            .collect();
        let address = *resolved.first().ok_or_else(|| format!("--api-listen {given}: resolves to no address; {LOOPBACK_ALLOWED}"))?;
        if let Some(outside) = resolved.iter().find(|candidate| !candidate.ip().to_canonical().is_loopback()) {
            self.check_network_flags(given, outside.ip())?;
        }
        let tls = self.api_tls_certificates.as_deref().map(ApiTls::load).transpose()?;
        Ok(Some(ApiListen { address, given: given.to_string(), tls, network_open: self.api_listen_any }))
    }

    /// Ok if both flags that open the API to the network are given, else what is missing.
    fn check_network_flags(&self, given: &str, outside: IpAddr) -> Result<(), String> {
        let missing: Vec<&str> = [
            (!self.api_listen_any).then_some("--api-listen-any (opens it to the network on purpose)"),
            self.api_tls_certificates
                .is_none()
                .then_some("--api-tls-certificates DIR (HTTPS: the token never crosses the network in plaintext)"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "--api-listen {given}: resolves to {outside}, which is not loopback; the management API listens beyond loopback only with \
             {NETWORK_FLAGS}; missing: {}; {LOOPBACK_ALLOWED}",
            missing.join(", ")
        ))
    }
}

impl ApiListen {
    pub fn https(&self) -> bool {
        self.tls.is_some()
    }

    fn scheme(&self) -> &'static str {
        if self.https() {
            "https"
        } else {
            "http"
        }
    }

    /// The names a Host may give besides addresses: the one given to `--api-listen`, the
    /// certificate's.
    fn host_names(&self) -> Vec<String> {
        let given_host = self.given.rsplit_once(':').map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'));
        let mut names: Vec<String> = given_host.filter(|host| host.parse::<IpAddr>().is_err()).map(str::to_string).into_iter().collect();
        names.extend(self.tls.iter().flat_map(|tls| tls.dns_names().iter().cloned()));
        names
    }

    /// Binds the listening socket: at start, before any drive is opened, so that an address in
    /// use stops the daemon with nothing touched.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn bind(&self) -> Result<std::net::TcpListener, String> {
        let address = self.address;
        let listener = std::net::TcpListener::bind(address).map_err(|e| format!("API on {address}: {e}"))?;
        listener.set_nonblocking(true).map_err(|e| format!("API on {address}: {e}"))?;
        Ok(listener)
    }

    /// Returns the server of `listener` (from [`ApiListen::bind`]) to run next to the Unix
    /// socket's; it stops on `shutdown`, as the other does.
    ///
    /// # Errors
    /// The listener cannot be handed to the runtime.
    pub fn serve(
        &self,
        listener: std::net::TcpListener,
        router: axum::Router,
        metrics_any_user: bool,
        token: Arc<ApiToken>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Pin<Box<dyn Future<Output = io::Result<()>> + Send>>, String> {
        let address = self.address;
        let tcp = tokio::net::TcpListener::from_std(listener).map_err(|e| format!("API on {address}: {e}"))?;
        let bound = tcp.local_addr().map_err(|e| format!("API on {address}: {e}"))?;
        let facts = ListenerFacts { bound: Some(bound), names: self.host_names(), https: self.https(), network_open: self.network_open };
        let service = tcp_router(router, &facts, metrics_any_user, token);
        Ok(match &self.tls {
            None => Box::pin(async move { axum::serve(tcp, service).with_graceful_shutdown(shutdown).await }),
            Some(tls) => {
                let listener = tls.listen(tcp).map_err(|e| format!("API on {address}: {e}"))?;
                Box::pin(async move { axum::serve(listener, service).with_graceful_shutdown(shutdown).await })
            }
        })
    }

    /// What the banner says about this listener: how to reach it, and a notice when it is open
    /// to the network.
    pub fn banner_lines(&self, data_dir: &Path) -> Vec<String> {
        let (scheme, address, token_file) = (self.scheme(), self.address, data_dir.join("api.token"));
        let token = format!("$(cat {})", token_file.display());
        let ca = self.tls.as_ref().map(|tls| {
            let ca_file = tls.dir().join(api_tls::CA_FILE);
            let ca_file = if ca_file.exists() { ca_file.display().to_string() } else { "CA-OF-server-cert.pem".to_string() };
            (format!(" --api-ca {ca_file}"), format!(" --cacert {ca_file}"))
        });
        let (cli_ca, curl_ca) = ca.unwrap_or_default();
        let cli_endpoint = if self.https() { format!("https://{address}") } else { format!("tcp:{address}") };
        let mut lines = vec![
            format!("  STORC_API_TOKEN={token} storc /c0 show --api {cli_endpoint}{cli_ca}"),
            format!("  the web console: {scheme}://{address}/ (log in with the token in {})", token_file.display()),
            format!("  curl{curl_ca} -H \"Authorization: Bearer {token}\" {scheme}://{address}/metrics    # Prometheus' text format"),
        ];
        if self.network_open && !address.ip().to_canonical().is_loopback() {
            lines.push(format!(
                "notice: the management API on {address} is open to the network (--api-listen-any), over HTTPS only; \
                 clients from the network need the token, local ones must be the daemon's user or root"
            ));
        }
        lines
    }
}

/// The API router and the console behind the TCP rules (Host names the listener, the client is
/// our user or root or remote on a listener opened on purpose, the request carries the token).
fn tcp_router(
    router: axum::Router,
    facts: &ListenerFacts,
    metrics_any_user: bool,
    token: Arc<ApiToken>,
) -> axum::extract::connect_info::IntoMakeServiceWithConnectInfo<axum::Router, TcpConnection> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let daemon_uid = unsafe { libc::geteuid() };
    let rules = Arc::new(TcpRules::new(facts, daemon_uid, metrics_any_user, Arc::clone(&token)));
    router
        .merge(console::router(token, facts.https))
        .layer(axum::middleware::from_fn_with_state(rules, tcp_api::guard))
        .into_make_service_with_connect_info::<TcpConnection>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[arg(long)]
        api_listen: Option<String>,
        #[command(flatten)]
        api: ApiListenArgs,
    }

    fn resolve(args: &[&str]) -> Result<Option<ApiListen>, String> {
        let flags = Flags::parse_from(std::iter::once("storc").chain(args.iter().copied()));
        flags.api.resolve(flags.api_listen.as_deref())
    }

    fn error_of(args: &[&str]) -> String {
        resolve(args).err().unwrap_or_else(|| panic!("{args:?} should be refused"))
    }

    #[test]
    fn loopback_needs_nothing_else() {
        let listen = resolve(&["--api-listen", "127.0.0.1:8080"]).unwrap().unwrap();
        assert_eq!(listen.address, "127.0.0.1:8080".parse().unwrap());
        assert!(!listen.https() && !listen.network_open);
        assert!(resolve(&[]).unwrap().is_none());
        let localhost = resolve(&["--api-listen", "localhost:8080"]).unwrap().unwrap();
        assert_eq!(localhost.host_names(), vec!["localhost".to_string()]);
    }

    #[test]
    fn beyond_loopback_needs_both_flags_and_says_which_are_missing() {
        let neither = error_of(&["--api-listen", "192.0.2.1:8443"]);
        assert_eq!(
            neither,
            "--api-listen 192.0.2.1:8443: resolves to 192.0.2.1, which is not loopback; the management API listens beyond loopback \
             only with --api-listen-any and --api-tls-certificates DIR; missing: --api-listen-any (opens it to the network on purpose), \
             --api-tls-certificates DIR (HTTPS: the token never crosses the network in plaintext); allowed: an address in 127.0.0.0/8, \
             [::1] or localhost, with a port (e.g. 127.0.0.1:8080)"
        );
        let no_tls = error_of(&["--api-listen", "0.0.0.0:8443", "--api-listen-any"]);
        assert!(no_tls.contains("resolves to 0.0.0.0, which is not loopback"), "{no_tls}");
        assert!(no_tls.contains("missing: --api-tls-certificates DIR (HTTPS") && !no_tls.contains("missing: --api-listen-any"), "{no_tls}");
        let no_any = error_of(&["--api-listen", "[::]:8443", "--api-tls-certificates", "/nonexistent"]);
        assert!(no_any.contains("missing: --api-listen-any (opens it to the network on purpose);"), "{no_any}");
        // Both given: the certificates are what is wrong now.
        let both = error_of(&["--api-listen", "0.0.0.0:8443", "--api-listen-any", "--api-tls-certificates", "/nonexistent"]);
        assert!(both.starts_with("--api-tls-certificates /nonexistent: cannot open server-cert.pem"), "{both}");
        let unresolvable = error_of(&["--api-listen", "127.evil.example:8080"]);
        assert!(unresolvable.starts_with("--api-listen 127.evil.example:8080: cannot resolve it"), "{unresolvable}");
        assert!(
            unresolvable.contains("loopback only; allowed: an address in 127.0.0.0/8, [::1] or localhost, with a port"),
            "{unresolvable}"
        );
    }

    #[test]
    fn network_flags_without_a_listener_are_refused() {
        assert_eq!(
            error_of(&["--api-listen-any"]),
            "--api-listen-any applies to the TCP management listener, which is off; allowed: --api-listen-any with --api-listen ADDRESS"
        );
        assert!(error_of(&["--api-tls-certificates", "dir"]).starts_with("--api-tls-certificates applies to the TCP management listener"));
    }
}
