//! Issue 14: the management API's TCP listener over HTTPS (`--api-tls-certificates`), and open to
//! the network only when asked (`--api-listen-any`) and with TLS.
//!
//! Certificates are made here with certtool (gnutls-bin), as an administrator would: a CA, and a
//! server certificate it signs for localhost, 127.0.0.1 and 10.78.0.1. curl and the storc CLI
//! verify the server against the CA and show the token; plain HTTP and requests without the token
//! are refused; a non-loopback address without both flags is refused at start. The network test
//! runs the daemon in a network namespace of its own, joined by a veth pair to a second one
//! where the clients run (10.78.0.1 and 10.78.0.2): its traffic never leaves this machine. It
//! needs root (`ip netns`) and iproute2, curl, gnutls-bin and util-linux; a missing one fails
//! the test, it never skips.

mod common;

use common::api_types::ControllerView;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What `certtool` made: a directory for `--api-tls-certificates` and the CA clients trust.
struct Certificates {
    dir: PathBuf,
    ca: PathBuf,
}

/// The server's names: the ones the clients below use.
const SERVER_TEMPLATE: &str =
    "cn = storc test server\ndns_name = localhost\ndns_name = storc.test\nip_address = 127.0.0.1\nip_address = 10.78.0.1\n\
                               tls_www_server\nsigning_key\nexpiration_days = 2\n";
const CA_TEMPLATE: &str = "cn = storc test CA\nca\ncert_signing_key\nexpiration_days = 2\n";

fn certtool(dir: &Path, args: &[&str]) {
    run(Command::new("certtool").current_dir(dir).args(args));
}

/// A CA and a server certificate signed by it, in `scratch/NAME` (ca-cert.pem, server-cert.pem,
/// server-key.pem; the CA's key beside them).
fn make_certificates(scratch: &Scratch, name: &str) -> Certificates {
    require_tool("certtool", "gnutls-bin");
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.info"), CA_TEMPLATE).unwrap();
    std::fs::write(dir.join("server.info"), SERVER_TEMPLATE).unwrap();
    certtool(&dir, &["--generate-privkey", "--key-type", "ecdsa", "--outfile", "ca-key.pem"]);
    certtool(&dir, &["--generate-self-signed", "--load-privkey", "ca-key.pem", "--template", "ca.info", "--outfile", "ca-cert.pem"]);
    certtool(&dir, &["--generate-privkey", "--key-type", "ecdsa", "--outfile", "server-key.pem"]);
    certtool(
        &dir,
        &[
            "--generate-certificate",
            "--load-privkey",
            "server-key.pem",
            "--load-ca-certificate",
            "ca-cert.pem",
            "--load-ca-privkey",
            "ca-key.pem",
            "--template",
            "server.info",
            "--outfile",
            "server-cert.pem",
        ],
    );
    Certificates { ca: dir.join("ca-cert.pem"), dir }
}

/// What curl got: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: String,
    body: String,
}

/// `curl ARGS URL` through `prefix` (e.g. `ip netns exec NAME`); it must complete an exchange.
fn curl(prefix: &[&str], args: &[&str], url: &str) -> Answer {
    let output = curl_output(prefix, args, url);
    assert!(output.status.success(), "curl {args:?} {url}: {}\n{}", output.status, text_of(&output));
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let (answer, status) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl printed no status: {text:?}"));
    let (headers, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    Answer {
        status: status.parse().unwrap_or_else(|_| panic!("curl status {status:?}")),
        headers: headers.to_lowercase(),
        body: body.to_string(),
    }
}

/// `-q` first: root's ~/.curlrc is not the test's.
fn curl_output(prefix: &[&str], args: &[&str], url: &str) -> Output {
    require_tool("curl", "curl");
    let (program, before) = prefix.split_first().map_or(("curl", &[][..]), |(program, rest)| (*program, rest));
    let mut command = Command::new(program);
    if !prefix.is_empty() {
        command.args(before).arg("curl");
    }
    command.args(["-q", "-sS", "-i", "-w", "\n%{http_code}", "--max-time", "20"]).args(args).arg(url);
    command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn bearer(daemon: &Daemon) -> String {
    format!("Authorization: Bearer {}", daemon.api_token())
}

/// The storc CLI with `--api ENDPOINT`, the token in STORC_API_TOKEN and `env` beside it.
fn storc_cli(prefix: &[&str], args: &[&str], env: &[(&str, &str)]) -> Output {
    let (program, before) = prefix.split_first().map_or((env!("CARGO_BIN_EXE_storc"), &[][..]), |(program, rest)| (*program, rest));
    let mut command = Command::new(program);
    if !prefix.is_empty() {
        command.args(before).arg(env!("CARGO_BIN_EXE_storc"));
    }
    command.args(args).env_remove("STORC_API").env_remove("STORC_API_CA").envs(env.iter().copied());
    command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn https_daemon(scratch: &Scratch, certificates: &Certificates) -> Daemon {
    let dir = certificates.dir.display().to_string();
    let options =
        DaemonOptions { nbd_tcp: false, api_tcp: true, extra_args: vec!["--api-tls-certificates".into(), dir], ..DaemonOptions::default() };
    Daemon::start_with(scratch, &mem_drives(2, "64MiB"), &options)
}

#[test]
fn curl_and_the_cli_reach_the_api_over_https_with_the_token_and_nothing_else_does() {
    let scratch = Scratch::new("api-tls");
    let certificates = make_certificates(&scratch, "tls");
    let daemon = https_daemon(&scratch, &certificates);
    let (address, ca) = (daemon.api_tcp_address().to_string(), certificates.ca.display().to_string());
    let url = format!("https://{address}/api/v1/controller");
    let port = address.rsplit_once(':').unwrap().1.to_string();

    let answer = curl(&[], &["--cacert", &ca, "-H", &bearer(&daemon)], &url);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let controller: ControllerView = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(controller.drives.len(), 2);
    // The certificate's names work too (the Host rule takes them); another name does not.
    let by_name = curl(&[], &["--cacert", &ca, "-H", &bearer(&daemon)], &url.replace("127.0.0.1", "localhost"));
    assert_eq!(by_name.status, 200, "{}", by_name.body);
    let resolve = format!("storc.test:{port}:127.0.0.1");
    let by_certificate_name =
        curl(&[], &["--cacert", &ca, "--resolve", &resolve, "-H", &bearer(&daemon)], &url.replace("127.0.0.1", "storc.test"));
    assert_eq!(by_certificate_name.status, 200, "{}", by_certificate_name.body);
    let foreign_host = curl(&[], &["--cacert", &ca, "-H", &bearer(&daemon), "-H", "Host: evil.example"], &url);
    assert_eq!(foreign_host.status, 421, "{}", foreign_host.body);

    let no_token = curl(&[], &["--cacert", &ca], &url);
    assert_eq!(no_token.status, 401, "{}", no_token.body);
    assert!(no_token.body.contains("this request carries no API token"), "{}", no_token.body);

    // Plain HTTP gets one answer that says what to use, and never the API.
    let plain = curl(&[], &["-H", &bearer(&daemon)], &format!("http://{address}/api/v1/controller"));
    assert_eq!(plain.status, 400, "{}", plain.body);
    assert!(plain.body.contains("this listener speaks HTTPS only") && plain.body.contains("https://"), "{}", plain.body);
    // Without the CA, curl does not trust the server (and sends nothing to it).
    let untrusted = curl_output(&[], &["-H", &bearer(&daemon)], &url);
    assert!(!untrusted.status.success() && text_of(&untrusted).contains("certificate"), "{}", text_of(&untrusted));

    let token = daemon.api_token();
    let endpoint = format!("https://{address}");
    for (args, env) in [
        (vec!["/c0", "show", "J", "--api", &endpoint, "--api-ca", &ca], vec![("STORC_API_TOKEN", token.as_str())]),
        (vec!["/c0", "show", "J"], vec![("STORC_API_TOKEN", token.as_str()), ("STORC_API", &endpoint), ("STORC_API_CA", &ca)]),
    ] {
        let output = storc_cli(&[], &args, &env);
        assert!(output.status.success(), "storc {args:?} with {env:?}: {}", text_of(&output));
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text_of(&output)));
        assert_eq!(answer["Controllers"][0]["Command Status"]["Status"], "Success", "{answer}");
    }
    let untrusted = storc_cli(&[], &["/c0", "show", "--api", &endpoint], &[("STORC_API_TOKEN", &token)]);
    assert_eq!(untrusted.status.code(), Some(1), "{}", text_of(&untrusted));
    assert!(
        text_of(&untrusted).contains(&format!(
            "the storc daemon at {endpoint} showed a certificate that does not verify against the system's trusted CAs"
        )) && text_of(&untrusted).contains("--api-ca FILE or STORC_API_CA=FILE"),
        "{}",
        text_of(&untrusted)
    );
    // The same server under an address its certificate does not name (IPv4-mapped IPv6) fails
    // the name check, before the token is sent.
    let unnamed = format!("https://[::ffff:127.0.0.1]:{port}");
    let misnamed = storc_cli(&[], &["/c0", "show", "--api", &unnamed, "--api-ca", &ca], &[("STORC_API_TOKEN", &token)]);
    assert_eq!(misnamed.status.code(), Some(1), "{}", text_of(&misnamed));
    assert!(
        text_of(&misnamed).contains(&format!(
            "the storc daemon at {unnamed} showed a certificate that does not verify against the CAs in {ca} for ::ffff:127.0.0.1"
        )),
        "{}",
        text_of(&misnamed)
    );
    let plain_cli = storc_cli(&[], &["/c0", "show", "--api", &format!("tcp:{address}")], &[("STORC_API_TOKEN", &token)]);
    assert_eq!(plain_cli.status.code(), Some(1), "{}", text_of(&plain_cli));
    assert!(text_of(&plain_cli).contains("HTTP 400") || text_of(&plain_cli).contains("speaks HTTPS only"), "{}", text_of(&plain_cli));

    let log = daemon.log();
    assert!(log.contains(&format!("storc /c0 show --api {endpoint} --api-ca {ca}")), "the banner should show the HTTPS CLI:\n{log}");
    assert!(log.contains(&format!("the web console: {endpoint}/")), "{log}");
    daemon.stop();
}

#[test]
fn the_console_logs_in_over_https_with_a_secure_cookie() {
    let scratch = Scratch::new("api-tls-console");
    let certificates = make_certificates(&scratch, "tls");
    let daemon = https_daemon(&scratch, &certificates);
    let (base, ca) = (format!("https://{}", daemon.api_tcp_address()), certificates.ca.display().to_string());

    let page = curl(&[], &["--cacert", &ca], &format!("{base}/"));
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<html") && page.headers.contains("content-security-policy"), "{}", page.headers);

    let login_body = format!("{{\"token\":\"{}\"}}", daemon.api_token());
    let login =
        curl(&[], &["--cacert", &ca, "-H", "Content-Type: application/json", "--data", &login_body], &format!("{base}/console/login"));
    assert_eq!(login.status, 204, "{}", login.body);
    let cookie_line = login.headers.lines().find(|line| line.starts_with("set-cookie:")).expect("a Set-Cookie header").to_string();
    for attribute in ["httponly", "samesite=strict", "secure"] {
        assert!(cookie_line.split(';').any(|part| part.trim() == attribute), "{attribute} missing in {cookie_line}");
    }
    // The browser sends the cookie back; it opens the API as the token does.
    let cookie = cookie_line.trim_start_matches("set-cookie:").split(';').next().unwrap().trim().to_string();
    let with_cookie = curl(&[], &["--cacert", &ca, "-H", &format!("Cookie: {cookie}")], &format!("{base}/api/v1/vds"));
    assert_eq!(with_cookie.status, 200, "{}", with_cookie.body);
    let logout = curl(&[], &["--cacert", &ca, "-X", "POST"], &format!("{base}/console/logout"));
    assert!(logout.headers.contains("max-age=0") && logout.headers.contains("; secure"), "{}", logout.headers);
    daemon.stop();
}

#[test]
fn a_non_loopback_api_address_needs_both_flags_and_bad_certificates_are_refused_before_anything_is_created() {
    let scratch = Scratch::new("api-tls-refused");
    let certificates = make_certificates(&scratch, "tls");
    let dir = certificates.dir.display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--api-listen", "10.78.0.1:8443"],
            "storc: --api-listen 10.78.0.1:8443: resolves to 10.78.0.1, which is not loopback; the management API listens beyond \
             loopback only with --api-listen-any and --api-tls-certificates DIR; missing: --api-listen-any (opens it to the network \
             on purpose), --api-tls-certificates DIR (HTTPS: the token never crosses the network in plaintext); allowed: an address \
             in 127.0.0.0/8, [::1] or localhost, with a port (e.g. 127.0.0.1:8080)",
        ),
        (&["--api-listen", "0.0.0.0:8443", "--api-listen-any"], "missing: --api-tls-certificates DIR (HTTPS: the token never crosses"),
        (
            &["--api-listen", "10.78.0.1:8443", "--api-tls-certificates", &dir],
            "missing: --api-listen-any (opens it to the network on purpose);",
        ),
        (
            &["--api-listen-any"],
            "--api-listen-any applies to the TCP management listener, which is off; allowed: --api-listen-any with --api-listen ADDRESS",
        ),
        (
            &["--api-listen", "127.0.0.1:8443", "--api-tls-certificates", &scratch.join("nowhere").display().to_string()],
            "cannot open server-cert.pem",
        ),
    ];
    for (args, expected) in cases {
        let text = serve_refused(&scratch, args, 1);
        assert!(text.contains(expected), "storc serve {args:?} should say {expected:?}:\n{text}");
    }
    // A key that is not the certificate's.
    let other = make_certificates(&scratch, "other");
    std::fs::copy(other.dir.join("server-key.pem"), certificates.dir.join("server-key.pem")).unwrap();
    let mismatch = serve_refused(&scratch, &["--api-listen", "127.0.0.1:8443", "--api-tls-certificates", &dir], 1);
    assert!(mismatch.contains("server-key.pem does not match server-cert.pem"), "{mismatch}");
    assert!(!scratch.data_dir().exists(), "a refused start created {}", scratch.data_dir().display());
}

// ---------------------------------------------------------------------------------------------
// A listener open to the network, in network namespaces this test makes

/// Two network namespaces joined by a veth pair: the server's (10.78.0.1/24) and the clients'
/// (10.78.0.2/24); both removed on drop, with the veth pair.
struct Network {
    server: String,
    client: String,
}

const SERVER_ADDRESS: &str = "10.78.0.1";
const CLIENT_ADDRESS: &str = "10.78.0.2";
const VETH: &str = "storc0";

impl Network {
    fn new(name: &str) -> Network {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test makes network namespaces (ip netns) and must run as root, not uid {euid}");
        nbd::testing::require_tool("ip", "iproute2", "makes network namespaces and a veth pair");
        let pid = std::process::id();
        let network = Network { server: format!("storc-{name}-s{pid}"), client: format!("storc-{name}-c{pid}") };
        for namespace in [&network.server, &network.client] {
            run(Command::new("ip").args(["netns", "add", namespace]));
        }
        // Made inside the namespaces, so the pair's names never meet the host's interfaces.
        run(Command::new("ip").args([
            "-n",
            &network.server,
            "link",
            "add",
            VETH,
            "type",
            "veth",
            "peer",
            "name",
            VETH,
            "netns",
            &network.client,
        ]));
        for (namespace, address) in [(&network.server, SERVER_ADDRESS), (&network.client, CLIENT_ADDRESS)] {
            run(Command::new("ip").args(["-n", namespace, "addr", "add", &format!("{address}/24"), "dev", VETH]));
            run(Command::new("ip").args(["-n", namespace, "link", "set", VETH, "up"]));
            run(Command::new("ip").args(["-n", namespace, "link", "set", "lo", "up"]));
        }
        network
    }

    fn in_server(&self) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.server]
    }

    fn in_client(&self) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.client]
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for namespace in [&self.server, &self.client] {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
        }
    }
}

#[test]
fn a_listener_opened_to_the_network_answers_a_remote_client_with_the_token_over_https_only() {
    let scratch = Scratch::new("api-tls-network");
    let certificates = make_certificates(&scratch, "tls");
    let network = Network::new("apitls");
    let listen = format!("{SERVER_ADDRESS}:8443");
    let options = DaemonOptions {
        nbd_tcp: false,
        extra_args: [
            "--api-listen",
            &listen,
            "--api-listen-any",
            "--api-tls-certificates",
            &certificates.dir.display().to_string(),
            "--metrics-any-user",
        ]
        .map(String::from)
        .to_vec(),
        command_prefix: network.in_server().iter().map(|part| part.to_string()).collect(),
        ..DaemonOptions::default()
    };
    let daemon = Daemon::start_with(&scratch, &mem_drives(2, "64MiB"), &options);
    let (ca, url) = (certificates.ca.display().to_string(), format!("https://{listen}/api/v1/controller"));

    // From the other namespace: the token opens it, nothing else does.
    let remote = curl(&network.in_client(), &["--cacert", &ca, "-H", &bearer(&daemon)], &url);
    assert_eq!(remote.status, 200, "{}", remote.body);
    let remote_without_token = curl(&network.in_client(), &["--cacert", &ca], &url);
    assert_eq!(remote_without_token.status, 401, "{}", remote_without_token.body);
    let remote_plain = curl(&network.in_client(), &["-H", &bearer(&daemon)], &format!("http://{listen}/api/v1/controller"));
    assert_eq!(remote_plain.status, 400, "{}", remote_plain.body);
    let token = daemon.api_token();
    let endpoint = format!("https://{listen}");
    let cli = storc_cli(&network.in_client(), &["/c0", "show", "--api", &endpoint, "--api-ca", &ca], &[("STORC_API_TOKEN", &token)]);
    assert!(cli.status.success() && text_of(&cli).contains("Status = Success"), "{}", text_of(&cli));

    // On the server's machine, a local user is still judged by its uid, even with the token.
    require_tool("setpriv", "util-linux");
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let as_nobody: Vec<&str> = network.in_server().into_iter().chain(["setpriv"]).chain(nobody).collect();
    let local_other = curl(&as_nobody, &["--cacert", &ca, "-H", &bearer(&daemon)], &url);
    assert_eq!(local_other.status, 403, "{}", local_other.body);
    assert!(local_other.body.contains("belongs to uid 65534"), "{}", local_other.body);
    let local_root = curl(&network.in_server(), &["--cacert", &ca, "-H", &bearer(&daemon)], &url);
    assert_eq!(local_root.status, 200, "{}", local_root.body);

    // --metrics-any-user opens /metrics to every local user, not to the network.
    let metrics = format!("https://{listen}/metrics");
    let local_scrape = curl(&as_nobody, &["--cacert", &ca], &metrics);
    assert_eq!(local_scrape.status, 200, "{}", local_scrape.body);
    assert!(local_scrape.body.contains("storc_"), "{}", local_scrape.body);
    let remote_scrape = curl(&network.in_client(), &["--cacert", &ca], &metrics);
    assert_eq!(remote_scrape.status, 401, "{}", remote_scrape.body);
    let remote_scrape_with_token = curl(&network.in_client(), &["--cacert", &ca, "-H", &bearer(&daemon)], &metrics);
    assert_eq!(remote_scrape_with_token.status, 200, "{}", remote_scrape_with_token.body);

    let log = daemon.log();
    assert!(log.contains(&format!("notice: the management API on {listen} is open to the network (--api-listen-any)")), "{log}");
    daemon.stop();
}
