//! Issue 8, part 5: another local user can neither read nor change the controller. The data
//! directory and everything storc puts in it are owner-only whatever the umask; the TCP
//! management API answers only the daemon's user and root, only a Host that names it, and (issue
//! 14) only a request carrying the token from `<data-dir>/api.token`; listen addresses must
//! resolve to loopback; `--nbd-listen none` leaves no TCP listener; `--socket-group` opens the
//! two sockets, and nothing else, to one group.
//!
//! The second-user test runs commands as `nobody` through setpriv, so this file must run as root
//! (CI does); as another user it fails and says so, it never skips.

mod common;

use common::api_types::ControllerView;
use common::*;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Exists on every Debian system and owns nothing.
const UNPRIVILEGED_USER: &str = "nobody";

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

fn check_mode(path: &Path, expected: u32, when: &str) {
    let mode = mode_of(path);
    assert_eq!(mode, expected, "{when}: {} is mode {mode:04o}, expected {expected:04o}", path.display());
}

/// Everything storc creates in its data directory with the embedded default.
fn owned_paths(data_dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    let mut paths: Vec<_> = (0..8).map(|i| (data_dir.join(format!("drive-{i}.img")), 0o600)).collect();
    paths.extend(["controller.id", "api.token", "nbd.sock", "api.sock"].iter().map(|name| (data_dir.join(name), 0o600)));
    paths.push((data_dir.to_path_buf(), 0o700));
    paths
}

/// Regression (issue 8): drive files were 0644 in a 0755 data directory, so any local user could
/// read every VD's raw data, and with a umask of 000 write it and connect to the sockets.
#[test]
fn files_and_sockets_are_owner_only_whatever_the_umask() {
    let scratch = Scratch::new("modes");
    let umask_zero = DaemonOptions { umask: Some(0), ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &[], &umask_zero);
    for (path, mode) in owned_paths(daemon.data_dir()) {
        check_mode(&path, mode, "first start with umask 000");
    }
    daemon.stop();

    // A data directory left open by an older storc (or a chmod) is tightened, and the log says so.
    let data_dir = scratch.data_dir();
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["drive-3.img", "controller.id", "api.token"] {
        std::fs::set_permissions(data_dir.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let old_log = data_dir.join("old.log");
    std::fs::write(&old_log, "from an older daemon\n").unwrap();
    std::fs::set_permissions(&old_log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let daemon = Daemon::start_with(&scratch, &[], &umask_zero);
    for (path, mode) in owned_paths(daemon.data_dir()) {
        check_mode(&path, mode, "restart after a chmod");
    }
    check_mode(&old_log, 0o600, "restart after a chmod");
    let log = daemon.log();
    let dir_line = format!("data directory {} was mode 0755, open to other users; now 0700", data_dir.display());
    for line in
        [dir_line.as_str(), "drive-3.img was mode 0644", "controller.id was mode 0644", "api.token was mode 0644", "old.log was mode 0666"]
    {
        assert!(log.contains(line), "the log should say what was tightened ({line:?}):\n{log}");
    }
    daemon.stop();
}

#[test]
fn a_drive_file_elsewhere_open_to_others_is_warned_about_and_left_alone() {
    let scratch = Scratch::new("drive-mode");
    let member = scratch.sparse_file("member.img", 64 * MIB);
    std::fs::set_permissions(&member, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut drives = vec![member.display().to_string()];
    drives.extend(mem_drives(1, "64MiB"));
    let daemon = Daemon::start(&scratch, &drives);
    let log = daemon.log();
    let warning = format!("--drive {} is mode 0644: every local user can open it", member.display());
    assert!(log.contains(&warning), "no warning {warning:?} in the log:\n{log}");
    assert!(log.contains(&format!("chmod go-rwx {}", member.display())), "the warning should say how to fix it:\n{log}");
    check_mode(&member, 0o644, "a file outside the data directory is the user's to change");
    daemon.stop();
}

// ---------------------------------------------------------------------------------------------
// A second, unprivileged user

struct User {
    name: &'static str,
    uid: u32,
    gid: u32,
}

fn id_of(flag: &str, user: &str) -> u32 {
    let text = stdout(&run(Command::new("id").args([flag, user])));
    text.trim().parse().unwrap_or_else(|_| panic!("id {flag} {user} printed {text:?}"))
}

/// Fails loudly unless the tests run as root: only root can act as another user.
fn unprivileged_user() -> User {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test runs commands as a second, unprivileged user ({UNPRIVILEGED_USER}) and must run as root (uid 0), not uid {euid}: sudo -E cargo test -p storc --test security");
    nbd::testing::require_tool("setpriv", "util-linux", "runs commands as another user");
    let user = User { name: UNPRIVILEGED_USER, uid: id_of("-u", UNPRIVILEGED_USER), gid: id_of("-g", UNPRIVILEGED_USER) };
    assert_ne!(user.uid, 0, "{} must not be root", user.name);
    user
}

/// `program args...` as `user`, without root's supplementary groups.
fn run_as(user: &User, program: &str, args: &[&str]) -> Output {
    run_as_in_groups(user, None, program, args)
}

/// `program args...` as `user`, in supplementary group `gid` only (`None`: in none).
fn run_as_in_groups(user: &User, gid: Option<u32>, program: &str, args: &[&str]) -> Output {
    let groups = gid.map_or_else(|| "--clear-groups".to_string(), |gid| format!("--groups={gid}"));
    Command::new("setpriv")
        .args([&format!("--reuid={}", user.uid), &format!("--regid={}", user.gid), &groups, "--", program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} as {}: {e}", user.name))
}

/// `curl` over TCP; the HTTP status and the body. `-q` first: root's ~/.curlrc is not the user's.
fn curl_tcp(user: &User, method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    curl_tcp_with(user, method, url, body, &[])
}

/// `curl_tcp` with further headers.
fn curl_tcp_with(user: &User, method: &str, url: &str, body: Option<&str>, headers: &[&str]) -> (u16, String) {
    let mut args = vec!["-q", "-sS", "-X", method, "-H", "Content-Type: application/json", "-w", "\n%{http_code}", url];
    if let Some(body) = body {
        args.extend(["--data", body]);
    }
    for header in headers {
        args.extend(["-H", header]);
    }
    let output = run_as(user, "curl", &args);
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "curl {method} {url} as {}: {}\n{}", user.name, output.status, text_of(&output));
    let (answer, status) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl printed no status: {text:?}"));
    (status.parse().unwrap_or_else(|_| panic!("curl status {status:?}")), answer.to_string())
}

/// What a user of the controller would see change: the generation, the VDs and the drives.
#[derive(Debug, PartialEq)]
struct Visible {
    generation: u64,
    vd_states: Vec<(String, String)>,
    drive_states: Vec<(u32, String)>,
}

fn what_a_user_would_notice(controller: &ControllerView) -> Visible {
    Visible {
        generation: controller.generation,
        vd_states: controller.vds.iter().map(|v| (v.name.clone(), v.state.clone())).collect(),
        drive_states: controller.drives.iter().map(|d| (d.slot, d.state.clone())).collect(),
    }
}

/// Regression (issue 8): another local user could read the member files and, through a TCP API,
/// take a drive offline and delete the VD.
#[test]
fn another_user_cannot_read_members_reach_the_sockets_or_change_anything_over_tcp() {
    let user = unprivileged_user();
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("curl", "curl");
    let scratch = Scratch::new("second-user");
    // The scratch directory is the test's (root's, 0700 under some umasks): let the user reach
    // the data directory's door, so that its own permissions are what is tested.
    std::fs::set_permissions(scratch.join(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = Daemon::start_with(&scratch, &[], &DaemonOptions { api_tcp: true, ..DaemonOptions::default() });
    let before = daemon.controller();

    let member = daemon.data_dir().join("drive-0.img");
    let read = run_as(&user, "head", &["-c", "4096", &member.display().to_string()]);
    assert!(!read.status.success(), "{} read {} ({} bytes)", user.name, member.display(), read.stdout.len());
    assert!(text_of(&read).contains("Permission denied"), "reading {} as {}: {}", member.display(), user.name, text_of(&read));
    for socket in ["nbd.sock", "api.sock"] {
        let uri = format!("nbd+unix:///?socket={}", daemon.data_dir().join(socket).display());
        let connect = run_as(&user, "nbdinfo", &["--list", &uri]);
        assert!(!connect.status.success(), "{} connected to {socket}: {}", user.name, text_of(&connect));
        assert!(text_of(&connect).contains("Permission denied"), "connecting to {socket} as {}: {}", user.name, text_of(&connect));
    }

    let api = format!("http://{}/api/v1", daemon.api_tcp_address());
    let attempts = [
        ("GET", format!("{api}/controller"), None),
        ("POST", format!("{api}/drives/2/state"), Some(r#"{"state":"offline"}"#)),
        ("DELETE", format!("{api}/vds/0?force=true"), None),
        ("POST", format!("{api}/vds"), Some(r#"{"level":"r1","drives":[5,6]}"#)),
    ];
    for (method, url, body) in &attempts {
        let (status, answer) = curl_tcp(&user, method, url, *body);
        assert_eq!(status, 403, "{method} {url} as {} answered {status}: {answer}", user.name);
        let expected = format!("belongs to uid {}; the management API over TCP answers only uid 0", user.uid);
        assert!(answer.contains(&expected), "{method} {url}: the refusal should name the user and who is allowed: {answer}");
    }
    let after = daemon.controller();
    assert_eq!(what_a_user_would_notice(&after), what_a_user_would_notice(&before), "refused requests changed the controller");

    // The refusal comes before the token is looked at: the user's requests fail the same with it.
    let authorization = format!("Authorization: Bearer {}", daemon.api_token());
    let (status, answer) = curl_tcp_with(&user, "GET", &format!("{api}/controller"), None, &[&authorization]);
    assert_eq!(status, 403, "GET over TCP as {} with the token answered {status}: {answer}", user.name);

    // The control: root reaches the same TCP API with the token, so the 403s above were about the user.
    let root = User { name: "root", uid: 0, gid: 0 };
    let (status, answer) = curl_tcp_with(&root, "GET", &format!("{api}/controller"), None, &[&authorization]);
    assert_eq!(status, 200, "GET over TCP as root: {answer}");
    daemon.stop();
}

/// Issue 14: `--metrics-any-user` lets a Prometheus running as its own user scrape `GET /metrics`
/// over TCP, and opens nothing else; without it, the metrics are the owner's like the rest.
#[test]
fn metrics_over_tcp_answer_another_user_only_when_asked_and_nothing_else_does() {
    let user = unprivileged_user();
    require_tool("curl", "curl");
    let scratch = Scratch::new("metrics-user");
    let open = DaemonOptions { api_tcp: true, extra_args: vec!["--metrics-any-user".into()], ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &mem_drives(3, "64MiB"), &open);
    daemon.create_vd("r1", &[0, 1], "db");
    let before = daemon.controller();
    let base = format!("http://{}", daemon.api_tcp_address());
    let (status, answer) = curl_tcp(&user, "GET", &format!("{base}/metrics"), None);
    assert_eq!(status, 200, "GET /metrics over TCP as {} with --metrics-any-user: {answer}", user.name);
    assert!(answer.contains("storc_vd_state{vd=\"0\",state=\"Optl\"} 1"), "{answer}");
    let attempts = [
        ("GET", "/api/v1/controller", None),
        ("POST", "/metrics", None),
        ("POST", "/api/v1/drives/1/state", Some(r#"{"state":"offline"}"#)),
    ];
    for (method, path, body) in attempts {
        let (status, answer) = curl_tcp(&user, method, &format!("{base}{path}"), body);
        assert_eq!(status, 403, "{method} {path} as {} answered {status}: {answer}", user.name);
    }
    assert_eq!(
        what_a_user_would_notice(&daemon.controller()),
        what_a_user_would_notice(&before),
        "refused requests changed the controller"
    );
    daemon.stop();

    let closed_scratch = Scratch::new("metrics-owner-only");
    let daemon = Daemon::start_with(&closed_scratch, &mem_drives(3, "64MiB"), &DaemonOptions { api_tcp: true, ..DaemonOptions::default() });
    let (status, answer) = curl_tcp(&user, "GET", &format!("http://{}/metrics", daemon.api_tcp_address()), None);
    assert_eq!(status, 403, "GET /metrics over TCP as {} without --metrics-any-user: {answer}", user.name);
    daemon.stop();

    let text = serve_refused(&Scratch::new("metrics-no-tcp"), &["--metrics-any-user"], 1);
    assert!(text.contains("storc: --metrics-any-user opens GET /metrics of the TCP API to every local user: give --api-listen"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// The TCP management API's Host rule

/// One request over TCP with the given Host header and further header lines; status and body.
fn http_tcp_with_host(address: &str, method: &str, path: &str, host: &str, headers: &str) -> (u16, String) {
    let (status, _, body) = http_tcp(address, method, path, host, headers, "");
    (status, body)
}

/// One request over TCP: status, the head of the answer, and its body.
fn http_tcp(address: &str, method: &str, path: &str, host: &str, headers: &str, body: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("connect {address}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("malformed answer {answer:?}"));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_string(), body.to_string())
}

/// Regression (issue 8): the TCP API accepted any Host, so a web page whose name the attacker's
/// DNS points at 127.0.0.1 (DNS rebinding) could drive it from a browser.
#[test]
fn a_foreign_host_header_over_tcp_is_refused() {
    let scratch = Scratch::new("host");
    let daemon = Daemon::start_with(&scratch, &mem_drives(3, "64MiB"), &DaemonOptions { api_tcp: true, ..DaemonOptions::default() });
    daemon.create_vd("r1", &[0, 1], "db");
    let before = daemon.controller();
    let address = daemon.api_tcp_address();
    let port = address.rsplit_once(':').unwrap().1;
    for (method, path) in [("GET", "/api/v1/controller"), ("DELETE", "/api/v1/vds/0?force=true")] {
        let (status, body) = http_tcp_with_host(address, method, path, &format!("rebind.evil.example:{port}"), "");
        assert_eq!(status, 421, "{method} {path} with a foreign Host answered {status}: {body}");
        let error: common::api_types::ApiError = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
        let expected = format!("Host \"rebind.evil.example:{port}\" is not this API's address; allowed: {address}, localhost:{port}");
        assert!(error.error.starts_with(&expected), "the refusal should name the Host received and the ones allowed: {}", error.error);
    }
    assert_eq!(what_a_user_would_notice(&daemon.controller()), what_a_user_would_notice(&before), "a refused request changed something");

    // The controls: the listener's own names, and the CLI, which sends the address it was given.
    let authorization = format!("Authorization: Bearer {}\r\n", daemon.api_token());
    for host in [address.to_string(), format!("localhost:{port}")] {
        let (status, body) = http_tcp_with_host(address, "GET", "/api/v1/controller", &host, &authorization);
        assert_eq!(status, 200, "GET with Host {host}: {body}");
    }
    let cli = Command::new(env!("CARGO_BIN_EXE_storc"))
        .args(["/c0", "show", "--api", &format!("tcp:{address}")])
        .env("STORC_API_TOKEN", daemon.api_token())
        .output()
        .unwrap();
    assert!(cli.status.success(), "storc /c0 show --api tcp:{address}: {}", text_of(&cli));
    daemon.stop();
}

// ---------------------------------------------------------------------------------------------
// The TCP management API's token (issue 14)

/// Requests that would each change the controller (or read it), with their bodies.
const CHANGING_REQUESTS: &[(&str, &str, &str)] = &[
    ("GET", "/api/v1/controller", ""),
    ("POST", "/api/v1/drives/1/state", r#"{"state":"offline"}"#),
    ("POST", "/api/v1/drives/2/hotspare", r#"{"drive_groups":[]}"#),
    ("PATCH", "/api/v1/vds/0", r#"{"read_policy":"ra"}"#),
    ("POST", "/api/v1/vds", r#"{"level":"r1","drives":[2,3]}"#),
    ("DELETE", "/api/v1/vds/0?force=true", ""),
];

/// Issue 14: a request over TCP without the API token (or with another one) is refused with 401
/// before any handler runs, and changes nothing. The token is written once, owner-only, and kept
/// across restarts; the console's login turns it into an HttpOnly, SameSite=Strict cookie.
#[test]
fn a_request_without_the_token_over_tcp_is_refused_with_401_and_changes_nothing() {
    let scratch = Scratch::new("token");
    let options = DaemonOptions { api_tcp: true, ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &mem_drives(4, "64MiB"), &options);
    daemon.create_vd("r1", &[0, 1], "db");
    let token = daemon.api_token();
    assert!(token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()), "api.token holds {token:?}");
    let token_path = daemon.data_dir().join("api.token");
    check_mode(&token_path, 0o600, "the first start");
    let before = daemon.controller();
    let address = daemon.api_tcp_address().to_string();
    let wrong = if token.starts_with('0') { "1".repeat(64) } else { "0".repeat(64) };
    let no_token = [
        String::new(),
        format!("Authorization: Bearer {wrong}\r\n"),
        format!("Cookie: storc_token={wrong}\r\n"),
        format!("Authorization: Basic {token}\r\n"),
    ];
    for credentials in &no_token {
        for (method, path, body) in CHANGING_REQUESTS {
            let (status, head, answer) = http_tcp(&address, method, path, &address, credentials, body);
            assert_eq!(status, 401, "{method} {path} with {credentials:?} answered {status}: {answer}");
            assert!(head.to_ascii_lowercase().contains("www-authenticate: bearer realm=\"storc\""), "a 401 names its scheme: {head}");
            let error: common::api_types::ApiError = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer}: {e}"));
            assert!(error.error.contains(&token_path.display().to_string()), "the refusal should say where the token is: {}", error.error);
        }
    }
    let after = daemon.controller();
    assert_eq!(what_a_user_would_notice(&after), what_a_user_would_notice(&before), "refused requests changed the controller");
    assert_eq!(after.vds[0].read_policy, before.vds[0].read_policy, "a refused PATCH changed a policy");

    // The controls: the token as a bearer, then as the cookie the console's login sets.
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, _, answer) = http_tcp(&address, "GET", "/api/v1/controller", &address, &bearer, "");
    assert_eq!(status, 200, "GET with the token: {answer}");
    let (status, head, _) = http_tcp(&address, "POST", "/console/login", &address, "", &format!(r#"{{"token":"{wrong}"}}"#));
    assert_eq!(status, 401, "a login with another token");
    assert!(!head.to_ascii_lowercase().contains("set-cookie"), "a failed login set a cookie: {head}");
    let (status, head, _) = http_tcp(&address, "POST", "/console/login", &address, "", &format!(r#"{{"token":"{token}"}}"#));
    assert_eq!(status, 204, "a login with the token: {head}");
    let cookie_line = head.lines().find(|line| line.to_ascii_lowercase().starts_with("set-cookie:")).expect("the login sets a cookie");
    for attribute in [format!("storc_token={token}"), "HttpOnly".into(), "SameSite=Strict".into(), "Path=/".into()] {
        assert!(cookie_line.contains(&attribute), "the cookie lacks {attribute}: {cookie_line}");
    }
    let (status, _, answer) = http_tcp(&address, "GET", "/api/v1/vds", &address, &format!("Cookie: storc_token={token}\r\n"), "");
    assert_eq!(status, 200, "GET with the login's cookie: {answer}");
    // The console's page itself needs no token: it holds nothing of the controller.
    let (status, head, page) = http_tcp(&address, "GET", "/", &address, "", "");
    assert_eq!(status, 200, "GET / without a token: {head}");
    assert!(page.contains("storc") && head.to_ascii_lowercase().contains("content-security-policy"), "{head}");
    daemon.stop();

    let daemon = Daemon::start_with(&scratch, &mem_drives(4, "64MiB"), &options);
    assert_eq!(daemon.api_token(), token, "a restart keeps the token");
    daemon.stop();
}

// ---------------------------------------------------------------------------------------------
// Listen addresses

/// Regression (issue 8): the loopback check took any host name that starts with `127.`.
#[test]
fn a_listen_name_that_only_starts_with_127_is_refused_before_anything_is_created() {
    let scratch = Scratch::new("listen");
    for flag in ["--nbd-listen", "--api-listen"] {
        let text = serve_refused(&scratch, &[flag, "127.evil.example:10809"], 1);
        let expected = format!("storc: {flag} 127.evil.example:10809: ");
        assert!(text.contains(&expected), "the error should name the flag and the address:\n{text}");
        assert!(text.contains("loopback only; allowed: an address in 127.0.0.0/8, [::1] or localhost, with a port"), "{text}");
        assert!(!scratch.data_dir().exists(), "{flag}: a refused start created {}", scratch.data_dir().display());
    }
}

/// The TCP listening sockets of process `pid` (the inodes of its socket fds, found in the
/// kernel's TCP tables in state LISTEN), as `local address` hex fields.
fn tcp_listeners_of(pid: u32) -> Vec<String> {
    const LISTEN_STATE: &str = "0A";
    let fd_dir = format!("/proc/{pid}/fd");
    let inodes: HashSet<String> = std::fs::read_dir(&fd_dir)
        .unwrap_or_else(|e| panic!("{fd_dir}: {e}"))
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| Some(target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string()))
        .collect();
    let mut listeners = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local remote st tx:rx tr:when retrnsmt uid timeout inode
            if fields.len() > 9 && fields[3] == LISTEN_STATE && inodes.contains(fields[9]) {
                listeners.push(fields[1].to_string());
            }
        }
    }
    listeners
}

#[test]
fn nbd_listen_none_leaves_no_tcp_listener_and_tcp_comes_with_a_warning() {
    const WARNING: &str = "has no TLS: every local user can read and write every VD through it";
    let scratch = Scratch::new("nbd-none");
    let daemon = Daemon::start_with(&scratch, &mem_drives(2, "64MiB"), &DaemonOptions { nbd_tcp: false, ..DaemonOptions::default() });
    daemon.create_vd("r1", &[0, 1], "db");
    assert_eq!(tcp_listeners_of(daemon.pid()), Vec::<String>::new(), "--nbd-listen none: the daemon listens on TCP");
    let endpoints = daemon.controller().nbd_endpoints;
    assert!(endpoints.iter().all(|e| e.starts_with("nbd+unix://")), "--nbd-listen none: endpoints {endpoints:?}");
    let log = daemon.log();
    assert!(!log.contains("nbd://") && !log.contains(WARNING), "--nbd-listen none: the banner offers TCP:\n{log}");
    daemon.stop();

    // The control: with TCP on, the same probe sees the listener, and startup warns.
    let daemon = Daemon::start(&scratch, &mem_drives(2, "64MiB"));
    assert_eq!(tcp_listeners_of(daemon.pid()).len(), 1, "with NBD over TCP the daemon should have one TCP listener");
    let log = daemon.log();
    assert!(log.contains(WARNING) && log.contains("--nbd-listen none"), "startup should warn about TCP and say how to turn it off:\n{log}");
    daemon.stop();
}

// ---------------------------------------------------------------------------------------------
// --socket-group

/// A group every Debian system has, which `nobody` is not in unless setpriv puts it there.
const SOCKET_GROUP: &str = "users";

fn gid_of(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).gid()
}

/// Issue 14: the sockets can be shared with a group (a backup user, a VM manager) without
/// sharing the drive files or a TCP listener.
#[test]
fn a_socket_group_member_can_use_the_sockets_and_nothing_else_and_others_cannot() {
    let user = unprivileged_user();
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("curl", "curl");
    let group_gid = id_of_group(SOCKET_GROUP);
    let scratch = Scratch::new("socket-group");
    std::fs::set_permissions(scratch.join(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let options =
        DaemonOptions { nbd_tcp: false, extra_args: vec!["--socket-group".into(), SOCKET_GROUP.into()], ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &[], &options);
    let data_dir = daemon.data_dir().to_path_buf();
    check_mode(&data_dir, 0o710, "--socket-group");
    for name in ["nbd.sock", "api.sock"] {
        check_mode(&data_dir.join(name), 0o660, "--socket-group");
        assert_eq!(gid_of(&data_dir.join(name)), group_gid, "{name} should belong to group {SOCKET_GROUP}");
    }
    assert_eq!(gid_of(&data_dir), group_gid, "the data directory should belong to group {SOCKET_GROUP}");
    for name in ["drive-0.img", "controller.id"] {
        check_mode(&data_dir.join(name), 0o600, "--socket-group leaves the files owner-only");
    }

    let nbd_uri = format!("nbd+unix:///?socket={}", data_dir.join("nbd.sock").display());
    let api_socket = data_dir.join("api.sock").display().to_string();
    let curl_api = ["-q", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", &api_socket, "http://storc/api/v1/controller"];
    // A member: both sockets work; the drive files and the directory listing do not.
    let listing = run_as_in_groups(&user, Some(group_gid), "nbdinfo", &["--list", &nbd_uri]);
    assert!(listing.status.success() && text_of(&listing).contains("export=\"v0\""), "a member of {SOCKET_GROUP}: {}", text_of(&listing));
    let api = run_as_in_groups(&user, Some(group_gid), "curl", &curl_api);
    assert_eq!(String::from_utf8_lossy(&api.stdout), "200", "a member of {SOCKET_GROUP} over api.sock: {}", text_of(&api));
    let member = data_dir.join("drive-0.img").display().to_string();
    let read = run_as_in_groups(&user, Some(group_gid), "head", &["-c", "4096", &member]);
    assert!(text_of(&read).contains("Permission denied"), "a member of {SOCKET_GROUP} read {member}: {}", text_of(&read));
    let list = run_as_in_groups(&user, Some(group_gid), "ls", &[&data_dir.display().to_string()]);
    assert!(!list.status.success(), "a member of {SOCKET_GROUP} listed the data directory: {}", text_of(&list));

    // Not a member: refused by the kernel, as without the flag.
    let outsider = run_as(&user, "nbdinfo", &["--list", &nbd_uri]);
    assert!(text_of(&outsider).contains("Permission denied"), "{} outside {SOCKET_GROUP}: {}", user.name, text_of(&outsider));
    let api = run_as(&user, "curl", &curl_api);
    assert_ne!(String::from_utf8_lossy(&api.stdout), "200", "{} outside {SOCKET_GROUP} reached api.sock", user.name);
    daemon.stop();

    // Without the flag again, everything is owner-only once more.
    let daemon = Daemon::start_with(&scratch, &[], &DaemonOptions { nbd_tcp: false, ..DaemonOptions::default() });
    for (path, mode) in owned_paths(daemon.data_dir()) {
        check_mode(&path, mode, "a restart without --socket-group");
    }
    daemon.stop();
}

fn id_of_group(name: &str) -> u32 {
    let text = stdout(&run(Command::new("getent").args(["group", name])));
    let gid = text.split(':').nth(2).unwrap_or_else(|| panic!("getent group {name} printed {text:?}"));
    gid.trim().parse().unwrap_or_else(|_| panic!("getent group {name} printed {text:?}"))
}

#[test]
fn an_unknown_socket_group_is_refused_before_anything_is_created() {
    let scratch = Scratch::new("socket-group-unknown");
    let text = serve_refused(&scratch, &["--socket-group", "no-such-group-storc"], 1);
    assert!(text.contains("--socket-group no-such-group-storc: no such group; allowed: a group name"), "{text}");
    assert!(!scratch.data_dir().exists(), "a refused start created {}", scratch.data_dir().display());
}
