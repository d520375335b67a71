//! Helpers for the end-to-end tests: a real `storc serve` in a scratch directory, a small
//! HTTP/1.1 client for its management API, random images, and the real NBD client tools.

#![allow(dead_code)] // each test uses a different subset

// The API's JSON types, the same file the daemon serializes and the CLI parses.
#[allow(dead_code, unused_imports)]
#[path = "../../src/api_types.rs"]
pub mod api_types;

use api_types::{ApiError, ControllerView, CreateVd, VdView};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::Cell;
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// From spawn to a working API, the embedded default's eight drive files included. A hang detector,
/// not a speed promise: a restart after kill -9 replays the journal and opens every member, and on
/// a loaded 2-core CI host that took over 10 s.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(60);
/// From SIGTERM to exit: in-flight I/O completes and the metadata is written.
pub const DAEMON_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Chunk size for writing and comparing images: bounds the test's memory, not its speed.
const CHUNK_BYTES: usize = 4 << 20;

// ---------------------------------------------------------------------------------------------
// Scratch directories

/// A directory unique to one test under /var/tmp (O_DIRECT works there; tmpfs refuses it),
/// removed when dropped.
pub struct Scratch {
    path: PathBuf,
    daemon_start_count: Cell<u32>,
}

impl Scratch {
    pub fn new(test_name: &str) -> Scratch {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = PathBuf::from("/var/tmp").join(format!("storc-e2e-{test_name}-{}-{unique}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Scratch { path, daemon_start_count: Cell::new(0) }
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The daemon's `--data-dir`: the same for every start, so restarts find their sockets.
    pub fn data_dir(&self) -> PathBuf {
        self.join("data")
    }

    /// A sparse file of `size_bytes`, for `--drive PATH`.
    pub fn sparse_file(&self, name: &str, size_bytes: u64) -> PathBuf {
        let path = self.join(name);
        let file = File::create(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        file.set_len(size_bytes).unwrap_or_else(|e| panic!("cannot size {} to {size_bytes} bytes: {e}", path.display()));
        path
    }

    fn next_log_path(&self) -> PathBuf {
        let start_index = self.daemon_start_count.get();
        self.daemon_start_count.set(start_index + 1);
        self.join(&format!("daemon-{start_index}.log"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon

/// A running `storc serve`. Dropping it kills the process, so a failing test leaks no daemon;
/// `stop` is the clean way out and checks the exit status.
pub struct Daemon {
    child: Option<Child>,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// `--nbd-listen`, unless it is `none`.
    nbd_address: Option<String>,
    /// `--api-listen`, if given.
    api_tcp_address: Option<String>,
    /// From spawn until the API first answered.
    pub startup: Duration,
}

/// How a test starts the daemon, beyond its drives.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// NBD on a free loopback port, or `--nbd-listen none`.
    pub nbd_tcp: bool,
    /// The management API on a free loopback port too (`--api-listen`).
    pub api_tcp: bool,
    /// The umask the daemon starts with (`None`: the test's own).
    pub umask: Option<u32>,
    /// Further `storc serve` flags.
    pub extra_args: Vec<String>,
    /// A command the daemon runs under, which must exec it in its own place (so that `stop`'s
    /// SIGTERM reaches storc), e.g. `ip netns exec NAME`.
    pub command_prefix: Vec<String>,
}

impl Default for DaemonOptions {
    fn default() -> DaemonOptions {
        DaemonOptions { nbd_tcp: true, api_tcp: false, umask: None, extra_args: Vec::new(), command_prefix: Vec::new() }
    }
}

impl Daemon {
    /// Starts `storc serve` on the scratch directory's data directory with one `--drive` per
    /// entry of `drives` (none: the embedded default), on a free loopback port, and waits until
    /// the API answers.
    pub fn start(scratch: &Scratch, drives: &[String]) -> Daemon {
        Daemon::start_with(scratch, drives, &DaemonOptions::default())
    }

    /// As [`Daemon::start`], with further `storc serve` flags.
    pub fn start_with_args(scratch: &Scratch, drives: &[String], extra_args: &[&str]) -> Daemon {
        let extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        Daemon::start_with(scratch, drives, &DaemonOptions { extra_args, ..DaemonOptions::default() })
    }

    /// `start` with listeners, umask and further flags chosen by `options`. A port picked free
    /// that someone else took before the daemon bound it (another test's client, whose local
    /// port the kernel picks from the same range) is picked again: the daemon binds its ports
    /// before it opens any drive, so a start refused for that touched nothing.
    pub fn start_with(scratch: &Scratch, drives: &[String], options: &DaemonOptions) -> Daemon {
        let mut attempt = 1;
        loop {
            match Daemon::try_start(scratch, drives, options) {
                Ok(daemon) => return daemon,
                Err(log_tail) if log_tail.contains("Address already in use") && attempt < PORT_ATTEMPTS => attempt += 1,
                Err(log_tail) => panic!("storc serve exited before its API answered\n{log_tail}"),
            }
        }
    }

    /// One start: the daemon once its API answers, or the tail of its log if it exited first.
    fn try_start(scratch: &Scratch, drives: &[String], options: &DaemonOptions) -> Result<Daemon, String> {
        let data_dir = scratch.data_dir();
        let log_path = scratch.next_log_path();
        let nbd_address = options.nbd_tcp.then(|| format!("127.0.0.1:{}", free_tcp_port()));
        let api_tcp_address = options.api_tcp.then(|| format!("127.0.0.1:{}", free_tcp_port()));
        let log = File::create(&log_path).unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let mut argv: Vec<String> = options.command_prefix.clone();
        if let Some(umask) = options.umask {
            // exec keeps the pid, so SIGTERM in `stop` still reaches storc.
            argv.extend(["sh", "-c", "umask \"$1\" && shift && exec \"$@\"", "sh"].map(String::from));
            argv.push(format!("{umask:03o}"));
        }
        argv.push(env!("CARGO_BIN_EXE_storc").to_string());
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        command.arg("serve").arg("--data-dir").arg(&data_dir).args(["--nbd-listen", nbd_address.as_deref().unwrap_or("none")]);
        if let Some(address) = &api_tcp_address {
            command.args(["--api-listen", address]);
        }
        for drive in drives {
            command.args(["--drive", drive]);
        }
        command.args(&options.extra_args);
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("log file handle")).stderr(log);
        let spawned_at = Instant::now();
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let mut daemon = Daemon { child: Some(child), data_dir, log_path, nbd_address, api_tcp_address, startup: Duration::ZERO };
        daemon.wait_for_api(spawned_at)?;
        daemon.startup = spawned_at.elapsed();
        Ok(daemon)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running daemon").id()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `127.0.0.1:PORT` of `--api-listen`; panics if the daemon was started without it.
    pub fn api_tcp_address(&self) -> &str {
        self.api_tcp_address.as_deref().expect("the daemon was started with DaemonOptions::api_tcp")
    }

    /// The management API's token (`<data-dir>/api.token`), which requests over TCP must carry.
    pub fn api_token(&self) -> String {
        let path = self.data_dir.join("api.token");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        text.trim().to_string()
    }

    /// Everything the daemon printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", self.log_path.display()))
    }

    /// Waits until the API answers; the tail of the log if the daemon exited first.
    fn wait_for_api(&mut self, spawned_at: Instant) -> Result<(), String> {
        let socket = self.api_socket();
        loop {
            if let Ok(reply) = http(&socket, "GET", "/api/v1/controller", None) {
                assert_eq!(reply.status, 200, "GET /api/v1/controller answered {}: {}", reply.status, reply.body);
                return Ok(());
            }
            let child = self.child.as_mut().expect("a running daemon");
            if let Some(status) = child.try_wait().expect("daemon status") {
                self.child = None;
                return Err(format!("exit status: {status}\n{}", self.log_tail()));
            }
            assert!(
                spawned_at.elapsed() < DAEMON_START_TIMEOUT,
                "the API at {} did not answer within {DAEMON_START_TIMEOUT:?}\n{}",
                socket.display(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits: the daemon must finish its I/O, write its metadata and exit 0.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("a running daemon");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, which has not been reaped yet, so the pid is its own.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill(SIGTERM) failed: {}", std::io::Error::last_os_error());
        let deadline = Instant::now() + DAEMON_STOP_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("daemon status") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("storc serve did not exit within {DAEMON_STOP_TIMEOUT:?} of SIGTERM\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "storc serve exited with {status} on SIGTERM, not 0\n{}", self.log_tail());
        assert!(!self.api_socket().exists(), "{} is left behind after a clean stop", self.api_socket().display());
    }

    /// SIGKILL, as a crash: nothing is flushed or written on the way out.
    pub fn kill9(mut self) {
        let mut child = self.child.take().expect("a running daemon");
        child.kill().expect("SIGKILL the daemon");
        child.wait().expect("reap the daemon");
    }

    /// Runs the storc CLI against this daemon: its exit status and what it printed (stdout,
    /// then stderr).
    pub fn cli_output(&self, args: &[&str]) -> (i32, String) {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_storc"))
            .args(args)
            .arg("--api")
            .arg(self.api_socket())
            .output()
            .expect("run the storc CLI");
        let text = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        (output.status.code().unwrap_or(-1), text)
    }

    /// [`Daemon::cli_output`] of a command that must succeed: what it printed.
    pub fn cli(&self, args: &[&str]) -> String {
        let (status, text) = self.cli_output(args);
        assert_eq!(status, 0, "storc {args:?} failed: {text}");
        text
    }

    pub fn api_socket(&self) -> PathBuf {
        self.data_dir.join("api.sock")
    }

    /// `nbd+unix:///EXPORT?socket=PATH`; an empty export name lists all with `nbdinfo --list`.
    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.data_dir.join("nbd.sock").display())
    }

    /// `127.0.0.1:PORT` of `--nbd-listen`; panics if the daemon was started with `none`.
    pub fn nbd_tcp_address(&self) -> &str {
        self.nbd_address.as_deref().expect("the daemon was started with NBD over TCP")
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.nbd_address.as_deref().expect("the daemon was started with NBD over TCP"))
    }

    /// One API request; panics only if the daemon does not answer.
    pub fn api(&self, method: &str, path: &str, body: Option<&impl Serialize>) -> Reply {
        let body = body.map(|b| serde_json::to_string(b).expect("request JSON"));
        http(&self.api_socket(), method, path, body.as_deref())
            .unwrap_or_else(|e| panic!("{method} {path}: no answer from {}: {e}\n{}", self.api_socket().display(), self.log_tail()))
    }

    /// A GET that must succeed, decoded.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> T {
        self.api("GET", path, None::<&()>).expect(200, &format!("GET {path}"))
    }

    pub fn controller(&self) -> ControllerView {
        self.get("/api/v1/controller")
    }

    pub fn vd_named(&self, name: &str) -> VdView {
        let vds: Vec<VdView> = self.get("/api/v1/vds");
        let names: Vec<&str> = vds.iter().map(|v| v.name.as_str()).collect();
        vds.iter().find(|v| v.name == name).cloned().unwrap_or_else(|| panic!("no VD named {name:?}; VDs: {names:?}"))
    }

    /// Creates a VD with the default policies; it must succeed.
    pub fn create_vd(&self, level: &str, drives: &[u32], name: &str) -> VdView {
        let body = create_vd_body(level, drives, name);
        self.api("POST", "/api/v1/vds", Some(&body)).expect(201, &format!("creating {level} {name:?} over slots {drives:?}"))
    }

    /// The last lines of the daemon's output, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        format!("--- last lines of {} ---\n{tail}", self.log_path.display())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                eprintln!("{}", self.log_tail());
            }
        }
    }
}

pub fn create_vd_body(level: &str, drives: &[u32], name: &str) -> CreateVd {
    CreateVd {
        level: level.into(),
        drives: drives.to_vec(),
        strip_kib: None,
        name: Some(name.into()),
        pdperarray: None,
        write_policy: None,
        read_policy: None,
        io_policy: None,
        cachecade: false,
        assign_vds: Vec::new(),
        seq_cutoff: None,
    }
}

/// Starts of a daemon whose picked port was taken meanwhile, at most (see `Daemon::start_with`).
const PORT_ATTEMPTS: u32 = 5;

/// A port nothing listens on now; the daemon binds it a moment later.
fn free_tcp_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// `count` memory drives of `size` each (`mem:64MiB`), as `--drive` arguments.
pub fn mem_drives(count: usize, size: &str) -> Vec<String> {
    vec![format!("mem:{size}"); count]
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 over the API's Unix socket

/// One answer of the management API: status and raw JSON body.
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    /// Decodes the body, after checking the status is `status`; `what` names the request.
    pub fn expect<T: DeserializeOwned>(&self, status: u16, what: &str) -> T {
        assert_eq!(self.status, status, "{what}: HTTP {}, expected {status}; body: {}", self.status, self.body);
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{what}: cannot decode {}: {e}", self.body))
    }

    /// The message of an error answer, after checking the status is `status`.
    pub fn expect_error(&self, status: u16, what: &str) -> String {
        self.expect::<ApiError>(status, what).error
    }
}

/// One request with `Connection: close`; the answer is read to EOF. No chunked bodies: the API
/// sends JSON with a Content-Length.
pub fn http(socket: &Path, method: &str, path: &str, body: Option<&str>) -> std::io::Result<Reply> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: storc\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let malformed = || std::io::Error::new(ErrorKind::InvalidData, format!("malformed HTTP answer: {answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(malformed)?;
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "the test client reads no chunked bodies: {head}");
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or_else(malformed)?;
    Ok(Reply { status, body: body.to_string() })
}

/// A client of `export` reading 4 KiB blocks in a loop over its first `size_bytes`, so that
/// background operations (rebuild, copy, check) run at their rate, not flat out. Set the flag
/// and join the thread to stop it.
pub fn busy_reader(
    daemon: &Daemon,
    export: &str,
    size_bytes: u64,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<()>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let uri = nbd::NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: export.into() };
    let mut client = nbd::Client::connect(&uri, &nbd::ClientConfig { structured_replies: true }).expect("connect the reader");
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop_seen = std::sync::Arc::clone(&stop);
    let reader = std::thread::spawn(move || {
        let mut offset = 0;
        while !stop_seen.load(Ordering::SeqCst) && client.read(offset, 4096).is_ok() {
            offset = (offset + (1 << 20) + 4096) % (size_bytes - 4096);
        }
    });
    (stop, reader)
}

// ---------------------------------------------------------------------------------------------
// Tools and images

/// Fails the test, saying how to install it, if a client tool is missing.
pub fn require_tool(tool: &str, debian_package: &str) {
    nbd::testing::require_tool(tool, debian_package, "runs it as a real NBD client");
}

#[allow(unused_imports)] // not every test file that includes this module runs commands
pub use nbd::testing::{run_ok as run, stdout_text as stdout};

/// Writes `len_bytes` of deterministic pseudo-random bytes (xorshift64*, so a failure
/// reproduces) to a new file, a chunk at a time.
pub fn write_random_image(path: &Path, len_bytes: u64, seed: u64) {
    let mut file = File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut written_bytes = 0;
    while written_bytes < len_bytes {
        for word in chunk.chunks_exact_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        let take_bytes = (len_bytes - written_bytes).min(CHUNK_BYTES as u64) as usize;
        file.write_all(&chunk[..take_bytes]).expect("write the image");
        written_bytes += take_bytes as u64;
    }
    assert_eq!(file.metadata().expect("image metadata").len(), len_bytes);
}

/// `nbdcopy IMAGE URI`: the image goes to the start of the export.
pub fn nbdcopy_in(image: &Path, uri: &str) {
    require_tool("nbdcopy", "libnbd-bin");
    run(Command::new("nbdcopy").arg(image).arg(uri));
}

/// Reads the whole export with `nbdcopy URI -` and checks, streaming, that it begins with the
/// bytes of `image` and is `export_size_bytes` long. Names the first byte that differs.
pub fn assert_export_starts_with(uri: &str, image: &Path, export_size_bytes: u64) {
    if let Some(difference) = export_difference(uri, image, export_size_bytes) {
        panic!("export {uri} does not hold {}: {difference}", image.display());
    }
}

/// Where the export `uri` stops holding `image` at its start, if it does; fails the test if
/// nbdcopy fails or the export is not `export_size_bytes` long.
pub fn export_difference(uri: &str, image: &Path, export_size_bytes: u64) -> Option<String> {
    require_tool("nbdcopy", "libnbd-bin");
    let mut nbdcopy = Command::new("nbdcopy")
        .arg(uri)
        .arg("-")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run nbdcopy {uri} -: {e}"));
    let mut export = BufReader::with_capacity(CHUNK_BYTES, nbdcopy.stdout.take().expect("piped stdout"));
    let image_len_bytes = std::fs::metadata(image).expect("image metadata").len();
    let mut expected = BufReader::with_capacity(CHUNK_BYTES, File::open(image).expect("open the image"));
    if let Some(difference) = compare_prefix(&mut export, &mut expected, image_len_bytes) {
        drop(export);
        let _ = nbdcopy.kill();
        let output = nbdcopy.wait_with_output().expect("nbdcopy status");
        return Some(format!("{difference}\nnbdcopy stderr: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let rest_bytes = std::io::copy(&mut export, &mut std::io::sink()).unwrap_or(0);
    drop(export);
    let output = nbdcopy.wait_with_output().expect("nbdcopy status");
    assert!(output.status.success(), "nbdcopy {uri} - failed with {}: {}", output.status, String::from_utf8_lossy(&output.stderr));
    let read_bytes = image_len_bytes + rest_bytes;
    assert_eq!(read_bytes, export_size_bytes, "nbdcopy read {read_bytes} bytes from {uri}; the API says the VD has {export_size_bytes}");
    None
}

/// Compares the first `len_bytes` of two streams; the first difference, described, if any.
fn compare_prefix(actual: &mut impl Read, expected: &mut impl Read, len_bytes: u64) -> Option<String> {
    let mut actual_chunk = vec![0u8; CHUNK_BYTES];
    let mut expected_chunk = vec![0u8; CHUNK_BYTES];
    let mut offset_bytes = 0u64;
    while offset_bytes < len_bytes {
        let take_bytes = (len_bytes - offset_bytes).min(CHUNK_BYTES as u64) as usize;
        expected.read_exact(&mut expected_chunk[..take_bytes]).expect("read the image");
        if let Err(error) = actual.read_exact(&mut actual_chunk[..take_bytes]) {
            return Some(format!("the export ended ({error}) within the {take_bytes} bytes at offset {offset_bytes}"));
        }
        if let Some(i) = (0..take_bytes).find(|&i| actual_chunk[i] != expected_chunk[i]) {
            let run_bytes = (i..take_bytes).take_while(|&j| actual_chunk[j] != expected_chunk[j]).count();
            return Some(format!(
                "first difference at byte {} (read {:#04x}, expected {:#04x}; {run_bytes} differing bytes in a row)",
                offset_bytes + i as u64,
                actual_chunk[i],
                expected_chunk[i]
            ));
        }
        offset_bytes += take_bytes as u64;
    }
    None
}

/// The lines of `nbdinfo --list` output for one export: from its heading to the next one.
pub fn nbdinfo_section<'a>(listing: &'a str, export: &str) -> &'a str {
    let heading = format!("export=\"{export}\":");
    let start = listing.find(&heading).unwrap_or_else(|| panic!("no {heading} in nbdinfo's listing:\n{listing}"));
    let rest = &listing[start + heading.len()..];
    &rest[..rest.find("export=").unwrap_or(rest.len())]
}

/// The `export-size:` value in nbdinfo output (`export-size: 125829120 (120M)`).
pub fn nbdinfo_export_size(text: &str) -> u64 {
    text.lines()
        .find_map(|line| line.trim().strip_prefix("export-size:"))
        .and_then(|size| size.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no export-size in nbdinfo output:\n{text}"))
}

/// A tiny deterministic generator (xorshift64*), so that a failing cycle or kill can be
/// replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, upper: u64) -> u64 {
        self.next() % upper
    }
}

/// The `len_bytes` contents of `block` at `version`, named by both in its first 16 bytes;
/// version 0 is the zeros of a block never written.
pub fn block_contents(block: u64, version: u64, len_bytes: usize) -> Vec<u8> {
    if version == 0 {
        return vec![0; len_bytes];
    }
    let mut rng = Rng(block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version ^ 1);
    let mut bytes = Vec::with_capacity(len_bytes);
    while bytes.len() < len_bytes {
        bytes.extend_from_slice(&rng.next().to_le_bytes());
    }
    bytes[..8].copy_from_slice(&block.to_le_bytes());
    bytes[8..16].copy_from_slice(&version.to_le_bytes());
    bytes
}

/// A refused start must not get as far as serving.
pub const REFUSED_START_TIMEOUT: Duration = Duration::from_secs(10);

/// What a command printed: stdout, then stderr.
pub fn text_of(output: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `storc serve ARGS` (one memory drive) that must be refused with exit status `expected_code`
/// (1: storc's own refusal; 2: clap's, for a value it does not know): what it printed, or a
/// failure if it runs on.
pub fn serve_refused(scratch: &Scratch, args: &[&str], expected_code: i32) -> String {
    let args: Vec<&str> = ["--drive", "mem:64MiB"].into_iter().chain(args.iter().copied()).collect();
    serve_refused_on(&scratch.data_dir(), &args, expected_code)
}

/// [`serve_refused`] on `data_dir`, with `args` alone.
pub fn serve_refused_on(data_dir: &Path, args: &[&str], expected_code: i32) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_storc"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start storc serve");
    let started_at = Instant::now();
    while child.try_wait().expect("storc serve status").is_none() {
        if started_at.elapsed() > REFUSED_START_TIMEOUT {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("storc serve {args:?} still runs after {REFUSED_START_TIMEOUT:?}; it should refuse:\n{}", text_of(&output));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(expected_code), "storc serve {args:?}: {}\n{}", output.status, text_of(&output));
    text_of(&output)
}
