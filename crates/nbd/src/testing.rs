//! Devices for testing the server alone, and for other crates' tests that need an NBD export
//! without the engine; and nbdkit as a third-party server for the client and the benchmark.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crate::device::{BlockDevice, Done, IoError, ReadDone};

/// A `Vec`-backed device that completes every request before returning. Trim zeroes, flush is
/// global (there is no cache), and counters record what reached it so tests can check that
/// flags were passed through.
pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
    block_size_bytes: u32,
    counters: Counters,
    /// How long each read takes, on the submitting thread (a drive read in place).
    read_delay_us: AtomicU64,
}

/// How many requests of each kind reached a [`MemDevice`].
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub write_zeroes: AtomicU64,
    /// Reads being served at this moment, and the most there ever were at once.
    reads_now: AtomicU64,
    pub reads_at_once_max: AtomicU64,
    /// The threads that submitted requests (the server's readers, for a device that serves in
    /// place).
    submitters: Mutex<Submitters>,
}

#[derive(Debug, Default)]
struct Submitters {
    distinct: HashSet<ThreadId>,
    last: Option<ThreadId>,
    /// Requests submitted by another thread than the request before.
    changes: u64,
}

impl Counters {
    /// Counts one request in `counter`, and notes the thread that submitted it.
    fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        let thread = thread::current().id();
        let mut submitters = self.submitters.lock().unwrap();
        submitters.distinct.insert(thread);
        if submitters.last.replace(thread).is_some_and(|last| last != thread) {
            submitters.changes += 1;
        }
    }

    /// How many distinct threads submitted requests.
    pub fn submitting_threads(&self) -> usize {
        self.submitters.lock().unwrap().distinct.len()
    }

    /// How many requests a thread submitted right after another thread's.
    pub fn submitter_changes(&self) -> u64 {
        self.submitters.lock().unwrap().changes
    }
}

impl MemDevice {
    /// A zero-filled device of `size_bytes` with 512-byte blocks.
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice::with_block_size(size_bytes, 512)
    }

    /// # Panics
    /// If `size_bytes` is not a multiple of `block_size_bytes`, or does not fit in memory.
    pub fn with_block_size(size_bytes: u64, block_size_bytes: u32) -> MemDevice {
        assert!(block_size_bytes.is_power_of_two());
        assert_eq!(size_bytes % u64::from(block_size_bytes), 0, "size is whole blocks");
        let len = usize::try_from(size_bytes).expect("MemDevice fits in memory");
        MemDevice { bytes: Mutex::new(vec![0; len]), block_size_bytes, counters: Counters::default(), read_delay_us: AtomicU64::new(0) }
    }

    /// Makes each read take `delay` on the thread that submits it, as a device that serves
    /// reads in place and waits for a disk would.
    pub fn set_read_delay(&self, delay: Duration) {
        self.read_delay_us.store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A copy of `len_bytes` at `offset`, for tests to compare against.
    pub fn snapshot(&self, offset: u64, len_bytes: usize) -> Vec<u8> {
        let bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        bytes[start..start + len_bytes].to_vec()
    }

    /// Writes `data` at `offset` directly, bypassing the server.
    pub fn fill(&self, offset: u64, data: &[u8]) {
        let mut bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        bytes[start..start + data.len()].copy_from_slice(data);
    }

    /// The byte range of a request, or `Invalid` if it leaves the device: the server checks
    /// ranges first, so reaching this error means a server bug, which the tests would see.
    fn range(&self, offset: u64, len_bytes: u64) -> Result<std::ops::Range<usize>, IoError> {
        let size_bytes = self.size_bytes();
        let end = offset.checked_add(len_bytes).filter(|&end| end <= size_bytes).ok_or(IoError::Invalid)?;
        Ok(offset as usize..end as usize)
    }

    fn zero(&self, offset: u64, len_bytes: u64) -> Result<(), IoError> {
        let range = self.range(offset, len_bytes)?;
        self.bytes.lock().unwrap()[range].fill(0);
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    type Buf = Vec<u8>;

    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }

    fn block_size_bytes(&self) -> u32 {
        self.block_size_bytes
    }

    fn alloc(&self, len_bytes: usize) -> Vec<u8> {
        vec![0; len_bytes]
    }

    fn flush_is_global(&self) -> bool {
        true
    }

    fn supports_trim(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, mut buf: Vec<u8>, done: ReadDone<Vec<u8>>) {
        self.counters.count(&self.counters.reads);
        let now = self.counters.reads_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.counters.reads_at_once_max.fetch_max(now, Ordering::SeqCst);
        thread::sleep(Duration::from_micros(self.read_delay_us.load(Ordering::Relaxed)));
        self.counters.reads_now.fetch_sub(1, Ordering::SeqCst);
        let result = self.range(offset, buf.len() as u64).map(|range| {
            buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
            buf
        });
        done(result);
    }

    fn write(&self, offset: u64, buf: Vec<u8>, fua: bool, done: Done) {
        self.counters.count(&self.counters.writes);
        if fua {
            self.counters.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        let result = self.range(offset, buf.len() as u64).map(|range| {
            self.bytes.lock().unwrap()[range].copy_from_slice(&buf);
        });
        done(result);
    }

    fn flush(&self, done: Done) {
        self.counters.count(&self.counters.flushes);
        done(Ok(()));
    }

    fn trim(&self, offset: u64, len_bytes: u64, done: Done) {
        self.counters.count(&self.counters.trims);
        done(self.zero(offset, len_bytes));
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64, _fua: bool, done: Done) {
        self.counters.count(&self.counters.write_zeroes);
        done(self.zero(offset, len_bytes));
    }
}

/// nbdkit serving on a Unix socket of its own, for tests that check storc against a third-party
/// NBD server. Dropping it kills nbdkit; [`Nbdkit::stop`] ends it with SIGTERM instead, so that
/// filters that report at exit (`--filter=stats`) write their files.
pub struct Nbdkit {
    child: Option<Child>,
    dir: PathBuf,
    socket_path: PathBuf,
}

/// From spawn until nbdkit accepts connections, and from SIGTERM until nbdkit has exited.
const NBDKIT_TIMEOUT: Duration = Duration::from_secs(10);

impl Nbdkit {
    /// Runs `nbdkit --foreground --exit-with-parent --unix SOCKET --pidfile PIDFILE ARGS...`:
    /// `args` are further options, filters, the plugin and its parameters
    /// (`["memory", "size=1G"]`). Returns once nbdkit accepts connections.
    ///
    /// # Panics
    /// If nbdkit is not installed (the message says how to install it: a test that needs it
    /// must fail, never skip), exits, or is not ready within 10 s.
    pub fn start(args: &[&str]) -> Nbdkit {
        require_tool("nbdkit", "nbdkit", "runs it as a real NBD server");
        let dir = unique_temp_dir("nbdkit");
        let socket_path = dir.join("nbdkit.sock");
        let pid_path = dir.join("nbdkit.pid");
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&socket_path)
            .arg("--pidfile")
            .arg(&pid_path)
            .args(args)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start nbdkit {args:?}: {error}"));
        let mut nbdkit = Nbdkit { child: Some(child), dir, socket_path };
        nbdkit.wait_until_ready(&pid_path, args);
        nbdkit
    }

    /// Waits for the pid file, which nbdkit writes once it listens (nbdkit(1), `--pidfile`).
    /// The socket alone is no sign: it exists from bind(2), and a connect(2) between bind and
    /// listen(2) is refused (a CI run failed so).
    fn wait_until_ready(&mut self, pid_path: &Path, args: &[&str]) {
        let deadline = Instant::now() + NBDKIT_TIMEOUT;
        // The file is written, not renamed into place: a whole line is a whole pid.
        while !std::fs::read_to_string(pid_path).is_ok_and(|pid| pid.ends_with('\n')) {
            let child = self.child.as_mut().expect("nbdkit is running");
            if let Some(status) = child.try_wait().expect("nbdkit's exit status") {
                panic!("nbdkit {args:?} exited with {status} before it was ready");
            }
            assert!(Instant::now() < deadline, "nbdkit {args:?} was not ready within {NBDKIT_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// `nbd+unix:///?socket=PATH`, the default export.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket_path.display())
    }

    /// Sends SIGTERM and waits for nbdkit to exit: it closes its connections, unloads its
    /// filters (the stats filter writes its file then) and exits 0.
    ///
    /// # Panics
    /// If nbdkit was already stopped, does not exit within 10 s, or exits with an error.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("nbdkit is running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, not reaped yet, so the pid is still its own.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill(SIGTERM): {}", std::io::Error::last_os_error());
        let deadline = Instant::now() + NBDKIT_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("nbdkit's exit status") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("nbdkit did not exit within {NBDKIT_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "nbdkit exited with {status} on SIGTERM");
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new directory under the system's temp dir, unique to this process and call.
fn unique_temp_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("storc-{name}-{}-{unique}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("cannot create {}: {error}", dir.display()));
    dir
}

/// Whether `tool` is an executable file on the PATH.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

/// Fails the test, saying how to install it, if `tool` is missing: tests that run real tools
/// must never pass by skipping. `purpose` completes "this test ...".
pub fn require_tool(tool: &str, debian_package: &str, purpose: &str) {
    assert!(on_path(tool), "`{tool}` is not installed, and this test {purpose}; install it with `apt-get install -y {debian_package}`");
}

/// Runs a command to completion and fails the test with its output if it fails.
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn stdout_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}
