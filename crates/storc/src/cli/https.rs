//! `storc --api https://HOST:PORT`: the management API over HTTPS (`storc serve
//! --api-tls-certificates`).
//!
//! The server's certificate must verify for the host in the URL (a DNS name or an IP address,
//! checked by OpenSSL against its subjectAltName) and chain to a trusted CA: only the ones in
//! `--api-ca FILE` (or `STORC_API_CA`) when given, else the system's (OpenSSL's default paths,
//! Debian's ca-certificates). The token goes in the request as over `tcp:`. OpenSSL, as in the
//! daemon (`daemon::api_tls` says why): one TLS library in the binary.

use openssl::ssl::{HandshakeError, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslStream, SslVerifyMode, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::verify::X509CheckFlags;
use openssl::x509::{X509VerifyResult, X509};
use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

const HTTPS_DEFAULT_PORT: u16 = 443;
const ALLOWED: &str = "allowed: https://HOST:PORT (e.g. https://127.0.0.1:8443, https://[::1]:8443, https://storc.example)";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpsEndpoint {
    /// A DNS name or an IP address (without brackets).
    host: String,
    port: u16,
    /// The CAs to trust instead of the system's.
    ca_file: Option<PathBuf>,
}

impl HttpsEndpoint {
    /// `rest` is what follows `https://`: `HOST[:PORT][/]`.
    ///
    /// # Errors
    /// A path, query, user or bad port, with what is allowed.
    pub fn parse(rest: &str, ca_file: Option<PathBuf>) -> Result<HttpsEndpoint, String> {
        let url = format!("https://{rest}");
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(format!("--api {url}: only a host and a port are taken; {ALLOWED}"));
        }
        let (host, port_text, bracketed) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (host, after) =
                    bracketed.split_once(']').ok_or_else(|| format!("--api {url}: no ']' after the IPv6 address; {ALLOWED}"))?;
                let port = (!after.is_empty()).then(|| after.strip_prefix(':').unwrap_or(after));
                (host, port, true)
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port), false),
                None => (authority, None, false),
            },
        };
        let port = match port_text {
            None => HTTPS_DEFAULT_PORT,
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|port| *port != 0)
                .ok_or_else(|| format!("--api {url}: the port {text:?} is not a number from 1 to 65535; {ALLOWED}"))?,
        };
        let well_formed = if bracketed { host.parse::<std::net::Ipv6Addr>().is_ok() } else { !host.is_empty() && !host.contains(':') };
        if !well_formed {
            return Err(format!("--api {url}: {host:?} is not a host name or an IP address (an IPv6 address goes in brackets); {ALLOWED}"));
        }
        Ok(HttpsEndpoint { host: host.to_string(), port, ca_file })
    }

    /// `host:port`, an IPv6 address in brackets.
    pub fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    /// What the Host header says: the authority, without the port when it is 443 (as browsers
    /// and curl send it).
    pub fn host_header(&self) -> String {
        let authority = self.authority();
        match self.port {
            HTTPS_DEFAULT_PORT => authority.strip_suffix(":443").unwrap_or(&authority).to_string(),
            _ => authority,
        }
    }

    /// Connects and completes a verified handshake; `timeout` bounds each read and write.
    ///
    /// # Errors
    /// A message for a person: the daemon is unreachable, its certificate does not verify (and
    /// how to give the CA), or it does not speak TLS.
    pub fn connect(&self, timeout: Duration) -> Result<SslStream<TcpStream>, String> {
        let context = self.context()?;
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).map_err(|error| {
            format!("cannot reach the storc daemon at {self} ({}); start it with: storc serve", super::http::io_reason(&error))
        })?;
        tcp.set_read_timeout(Some(timeout)).and_then(|()| tcp.set_write_timeout(Some(timeout))).map_err(|e| e.to_string())?;
        // Each handshake record and the request go out at once, not behind Nagle's algorithm.
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let ssl = self.session(&context).map_err(|e| e.to_string())?;
        ssl.connect(tcp).map_err(|error| self.handshake_failure(error))
    }

    /// What `openssl::ssl::SslConnector` sets up, except that with `--api-ca` the system's CA
    /// bundle is never loaded (parsing it costs about 40 ms a command, for CAs not trusted here).
    fn context(&self) -> Result<SslContext, String> {
        let stack = |error: openssl::error::ErrorStack| error.to_string();
        let mut builder = SslContextBuilder::new(SslMethod::tls_client()).map_err(stack)?;
        builder.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(stack)?;
        // Each answer is framed (Content-Length or chunks): a missing close_notify loses nothing.
        builder.set_options(SslOptions::IGNORE_UNEXPECTED_EOF | SslOptions::NO_COMPRESSION);
        builder.set_alpn_protos(b"\x08http/1.1").map_err(stack)?;
        builder.set_verify(SslVerifyMode::PEER);
        match &self.ca_file {
            Some(ca_file) => {
                let mut store = X509StoreBuilder::new().map_err(stack)?;
                for ca in load_cas(ca_file)? {
                    store.add_cert(ca).map_err(stack)?;
                }
                builder.set_cert_store(store.build());
            }
            None => builder.set_default_verify_paths().map_err(stack)?,
        }
        Ok(builder.build())
    }

    /// One connection's TLS: the certificate must name the URL's host (an IP address as an IP
    /// address, no partial wildcards, as `SslConnector` checks it); a name also goes as SNI.
    fn session(&self, context: &SslContext) -> Result<Ssl, openssl::error::ErrorStack> {
        let mut ssl = Ssl::new(context)?;
        ssl.param_mut().set_hostflags(X509CheckFlags::NO_PARTIAL_WILDCARDS);
        match self.host.parse::<IpAddr>() {
            Ok(ip) => ssl.param_mut().set_ip(ip)?,
            Err(_) => {
                ssl.param_mut().set_host(&self.host)?;
                ssl.set_hostname(&self.host)?;
            }
        }
        Ok(ssl)
    }

    fn handshake_failure(&self, error: HandshakeError<TcpStream>) -> String {
        let trusted = match &self.ca_file {
            Some(file) => format!("the CAs in {}", file.display()),
            None => "the system's trusted CAs".to_string(),
        };
        match error {
            HandshakeError::Failure(mid) if mid.ssl().verify_result() != X509VerifyResult::OK => format!(
                "the storc daemon at {self} showed a certificate that does not verify against {trusted} for {} ({}); \
                 give the CA that signed its server-cert.pem with --api-ca FILE or STORC_API_CA=FILE",
                self.host,
                mid.ssl().verify_result().error_string()
            ),
            HandshakeError::Failure(mid) => format!(
                "the TLS handshake with the storc daemon at {self} failed ({}); does it serve HTTPS (storc serve --api-tls-certificates DIR)? \
                 A plain-HTTP listener is --api tcp:{}",
                mid.error(),
                self.authority()
            ),
            HandshakeError::WouldBlock(_) => format!("the storc daemon at {self} did not finish the TLS handshake in time"),
            HandshakeError::SetupFailure(stack) => format!("cannot set up TLS for {self}: {stack}"),
        }
    }
}

impl std::fmt::Display for HttpsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "https://{}", self.authority())
    }
}

/// Every certificate of a PEM file.
fn load_cas(file: &Path) -> Result<Vec<X509>, String> {
    let pem =
        std::fs::read(file).map_err(|error| format!("--api-ca {}: cannot read it ({})", file.display(), super::http::io_reason(&error)))?;
    let certificates =
        X509::stack_from_pem(&pem).map_err(|error| format!("--api-ca {}: not PEM certificates ({error})", file.display()))?;
    if certificates.is_empty() {
        return Err(format!("--api-ca {}: holds no certificate; allowed: a PEM file of CA certificates", file.display()));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(rest: &str) -> Result<(String, String), String> {
        HttpsEndpoint::parse(rest, None).map(|endpoint| (endpoint.authority(), endpoint.host_header()))
    }

    #[test]
    fn urls() {
        let pair = |a: &str, h: &str| Ok((a.to_string(), h.to_string()));
        assert_eq!(parsed("127.0.0.1:8443"), pair("127.0.0.1:8443", "127.0.0.1:8443"));
        assert_eq!(parsed("127.0.0.1:8443/"), pair("127.0.0.1:8443", "127.0.0.1:8443"));
        assert_eq!(parsed("[::1]:8443"), pair("[::1]:8443", "[::1]:8443"));
        assert_eq!(parsed("[::1]"), pair("[::1]:443", "[::1]"));
        assert_eq!(parsed("storc.example"), pair("storc.example:443", "storc.example"));
        assert_eq!(parsed("storc.example:443"), pair("storc.example:443", "storc.example"));
        for (rest, why) in [
            ("127.0.0.1:8443/api", "only a host and a port are taken"),
            ("user@127.0.0.1:8443", "only a host and a port are taken"),
            ("", "only a host and a port are taken"),
            ("127.0.0.1:0", "the port \"0\" is not a number from 1 to 65535"),
            ("127.0.0.1:http", "the port \"http\" is not a number from 1 to 65535"),
            ("[::1:8443", "no ']' after the IPv6 address"),
            ("::1:8443", "\"::1\" is not a host name or an IP address"),
        ] {
            let error = parsed(rest).unwrap_err();
            assert!(error.starts_with(&format!("--api https://{rest}: {why}")), "{rest}: {error}");
            assert!(error.ends_with(ALLOWED), "{error}");
        }
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_is_refused() {
        let file = std::env::temp_dir().join(format!("storc-cli-ca-{}.pem", std::process::id()));
        std::fs::write(&file, "not a certificate\n").unwrap();
        let endpoint = HttpsEndpoint::parse("127.0.0.1:1", Some(file.clone())).unwrap();
        let error = endpoint.connect(Duration::from_secs(1)).unwrap_err();
        assert!(error.starts_with(&format!("--api-ca {}: holds no certificate", file.display())), "{error}");
        let _ = std::fs::remove_file(&file);
        let missing = HttpsEndpoint::parse("127.0.0.1:1", Some(PathBuf::from("/nonexistent/ca.pem"))).unwrap();
        assert_eq!(
            missing.connect(Duration::from_secs(1)).unwrap_err(),
            "--api-ca /nonexistent/ca.pem: cannot read it (No such file or directory)"
        );
    }
}
