//! The storcli-style command line: `storc /c0/v0 show all J`.
//!
//! A command line becomes API requests in `parse` (pure, and checked before anything is sent, so
//! bad input changes nothing), travels to the daemon over `http`, and comes back in storcli's text
//! or JSON shape from `render`. This module keeps no state and decides nothing the daemon decides:
//! it validates syntax and the rules `layout` states, and shows what the daemon answers.
//!
//! Exit status: 0 success, 1 an error from (or no answer from) the daemon, 2 a usage error.

mod bad_blocks;
mod bgi;
mod cc;
mod copyback;
mod http;
mod https;
mod journal;
mod migrate;
mod parse;
mod patrol;
mod render;
mod table;

pub(crate) use http::API_SOCKET_DEFAULT;
use http::{ApiSettings, Endpoint, Request};
pub(crate) use parse::{ObjectCommands, OBJECT_COMMANDS};
use render::{Controller, Report};
use serde_json::Value;
use std::io::Write;
use std::process::ExitCode;

/// Runs one command; `args` are the arguments after the binary name, e.g. `["/c0", "show"]`.
/// Output goes to stdout, failures included, as storcli does: scripts read one stream.
pub fn run(args: Vec<String>) -> ExitCode {
    let env = ApiSettings { api: std::env::var("STORC_API").ok(), ca: std::env::var("STORC_API_CA").ok() };
    let exit_code = run_with(args, env, &mut std::io::stdout().lock());
    ExitCode::from(exit_code)
}

/// Why a command did not succeed; the exit status tells scripts which.
enum Failure {
    /// The command line is wrong; nothing was sent.
    Usage(String),
    /// The daemon refused, failed, or could not be reached.
    Daemon(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Daemon(_) => 1,
            Failure::Usage(_) => 2,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Usage(message) | Failure::Daemon(message) => message,
        }
    }

    /// A usage error may name a controller that does not exist, so its header names none.
    fn controller(&self) -> Controller {
        match self {
            Failure::Usage(_) => Controller::Unknown,
            Failure::Daemon(_) => Controller::Zero,
        }
    }
}

/// `run` with its environment passed in, so tests can point it at a fake daemon and read its output.
fn run_with(mut args: Vec<String>, env: ApiSettings, out: &mut dyn Write) -> u8 {
    let options = http::take_api_options(&mut args);
    let json_output = parse::wants_json(&args);
    let endpoint = options.and_then(|options| Endpoint::choose(options, env)).map_err(Failure::Usage);
    let outcome = endpoint.and_then(|endpoint| execute(&args, endpoint));
    let (text, exit_code) = match &outcome {
        Ok(report) => (render::success(report, json_output), 0),
        Err(failure) => {
            let text = render::failure(failure.message(), failure.controller(), json_output);
            (text, failure.exit_code())
        }
    };
    // Nothing useful is left to do when stdout is gone (a closed pipe); the exit code still tells.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    exit_code
}

fn execute(args: &[String], endpoint: Endpoint) -> Result<Report, Failure> {
    let invocation = parse::parse(args).map_err(|error| Failure::Usage(error.0))?;
    let requests = invocation.action.requests();
    let answers = requests.iter().map(|request| call(&endpoint, request)).collect::<Result<Vec<Value>, Failure>>()?;
    render::report(&invocation.action, &answers).map_err(Failure::Daemon)
}

/// One request; a non-2xx answer becomes the daemon's own error message.
fn call(endpoint: &Endpoint, request: &Request) -> Result<Value, Failure> {
    let response = http::send(endpoint, request).map_err(Failure::Daemon)?;
    if !(200..300).contains(&response.status_code) {
        return Err(Failure::Daemon(error_message(request, response.status_code, &response.body)));
    }
    if response.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&response.body)
        .map_err(|error| Failure::Daemon(format!("the storc daemon answered {request} with invalid JSON: {error}")))
}

/// The `ApiError` message when the body is one; otherwise enough to tell what happened.
fn error_message(request: &Request, status_code: u16, body: &[u8]) -> String {
    if let Ok(api_error) = serde_json::from_slice::<crate::api_types::ApiError>(body) {
        return api_error.error;
    }
    const BODY_CHARS_SHOWN_MAX: usize = 200;
    let body_text: String = String::from_utf8_lossy(body).chars().take(BODY_CHARS_SHOWN_MAX).collect();
    let body_text = if body_text.trim().is_empty() { "no error message".to_string() } else { body_text };
    format!("the storc daemon answered HTTP {status_code} to {request} ({body_text})")
}

#[cfg(test)]
mod tests {
    use super::render::tests::sample_vd;
    use super::*;
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::net::UnixListener;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread::JoinHandle;

    /// A fake daemon: answers each connection in turn with the next canned (status, JSON) and
    /// returns the request lines it saw.
    struct FakeDaemon {
        dir: PathBuf,
        thread: Option<JoinHandle<Vec<String>>>,
    }

    impl FakeDaemon {
        fn start(answers: Vec<(u16, String)>) -> FakeDaemon {
            static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("storc-cli-test-{}-{id}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let listener = UnixListener::bind(dir.join("api.sock")).unwrap();
            let thread =
                std::thread::spawn(move || answers.into_iter().map(|answer| answer_one(listener.accept().unwrap().0, answer)).collect());
            FakeDaemon { dir, thread: Some(thread) }
        }

        fn socket(&self) -> String {
            self.dir.join("api.sock").display().to_string()
        }

        fn requests_seen(mut self) -> Vec<String> {
            self.thread.take().unwrap().join().unwrap()
        }
    }

    impl Drop for FakeDaemon {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn answer_one(stream: impl Read + Write, (status_code, body): (u16, String)) -> String {
        let mut reader = BufReader::new(stream);
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let mut content_length_bytes = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                content_length_bytes = value.trim().parse().unwrap();
            }
        }
        let mut request_body = vec![0; content_length_bytes];
        reader.read_exact(&mut request_body).unwrap();
        let answer = format!("HTTP/1.1 {status_code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        reader.get_mut().write_all(answer.as_bytes()).unwrap();
        request_line.trim_end().to_string() + " " + &String::from_utf8(request_body).unwrap()
    }

    fn run_to_string(args: &[&str], api_env: Option<&str>) -> (u8, String) {
        let mut out = Vec::new();
        let env = ApiSettings { api: api_env.map(String::from), ca: None };
        let exit_code = run_with(args.iter().map(|arg| arg.to_string()).collect(), env, &mut out);
        (exit_code, String::from_utf8(out).unwrap())
    }

    #[test]
    fn vall_show_prints_the_vd_table() {
        let daemon = FakeDaemon::start(vec![(200, serde_json::to_string(&vec![sample_vd()]).unwrap())]);
        let (exit_code, output) = run_to_string(&["/c0/vall", "show"], Some(&daemon.socket()));
        assert_eq!(exit_code, 0, "{output}");
        assert!(
            output
                .starts_with("CLI Version = storc 0.1.0\nController = 0\nStatus = Success\nDescription = Show Virtual Drives Succeeded\n"),
            "{output}"
        );
        assert!(output.contains("\nDG/VD TYPE  State Consist Size     Strip  Cache FP Name Export\n"), "{output}");
        assert!(output.contains("\n0/0   RAID5 Dgrd  Yes     48.0 GiB 64 KiB NRWTD No db   db\n"), "{output}");
        assert!(output.contains("NR=No Read Ahead"), "the legend explains the cache code");
        assert_eq!(daemon.requests_seen(), vec!["GET /api/v1/vds HTTP/1.1 "]);
    }

    #[test]
    fn json_output_wraps_the_api_answer_in_storclis_envelope() {
        let daemon = FakeDaemon::start(vec![(200, serde_json::to_string(&vec![sample_vd()]).unwrap())]);
        let (exit_code, output) = run_to_string(&["/c0/vall", "--api", &daemon.socket(), "show", "J"], None);
        assert_eq!(exit_code, 0, "{output}");
        let envelope: Value = serde_json::from_str(&output).unwrap();
        let controller = &envelope["Controllers"][0];
        assert_eq!(controller["Command Status"]["Status"], "Success");
        assert_eq!(controller["Response Data"][0]["export_name"], "db");
    }

    #[test]
    fn vd_show_all_asks_for_the_vd_and_the_drives() {
        let drives: Vec<_> = (0..3).map(super::render::tests::sample_drive).collect();
        let daemon =
            FakeDaemon::start(vec![(200, serde_json::to_string(&sample_vd()).unwrap()), (200, serde_json::to_string(&drives).unwrap())]);
        let (exit_code, output) = run_to_string(&["/c0/v0", "show", "all"], Some(&daemon.socket()));
        assert_eq!(exit_code, 0, "{output}");
        assert!(output.contains("\nPDs for VD 0 :\n"), "{output}");
        assert!(output.contains("\nExport Name = db\n"), "{output}");
        let seen = daemon.requests_seen();
        assert_eq!(seen, vec!["GET /api/v1/vds/0 HTTP/1.1 ", "GET /api/v1/drives HTTP/1.1 "]);
    }

    #[test]
    fn tcp_endpoints_work_alike() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api = format!("tcp:{}", listener.local_addr().unwrap());
        let answer = (200, r#"{"message":"foreign configuration imported"}"#.to_string());
        let server = std::thread::spawn(move || answer_one(listener.accept().unwrap().0, answer));
        let (exit_code, output) = run_to_string(&["/c0/fall", "import", "--api", &api], None);
        assert_eq!(exit_code, 0, "{output}");
        assert!(output.ends_with("Description = foreign configuration imported\n"), "{output}");
        assert_eq!(server.join().unwrap(), "POST /api/v1/foreign/import HTTP/1.1 ");
    }

    #[test]
    fn a_daemon_error_is_a_failure_with_its_message_and_exit_1() {
        let error = r#"{"error":"no VD 9; VDs: 0"}"#.to_string();
        let daemon = FakeDaemon::start(vec![(404, error)]);
        let (exit_code, output) = run_to_string(&["/c0/v9", "set", "wrcache=wb"], Some(&daemon.socket()));
        assert_eq!(exit_code, 1);
        assert_eq!(output, "CLI Version = storc 0.1.0\nController = 0\nStatus = Failure\nDescription = no VD 9; VDs: 0\n");
        let seen = daemon.requests_seen();
        assert_eq!(seen, vec![r#"PATCH /api/v1/vds/9 HTTP/1.1 {"write_policy":"wb","read_policy":null,"io_policy":null,"name":null}"#]);
    }

    #[test]
    fn an_error_without_an_api_error_body_names_the_status_and_request() {
        let daemon = FakeDaemon::start(vec![(500, String::new())]);
        let (exit_code, output) = run_to_string(&["/c0/fall", "import"], Some(&daemon.socket()));
        assert_eq!(exit_code, 1);
        assert!(
            output.ends_with("Description = the storc daemon answered HTTP 500 to POST /api/v1/foreign/import (no error message)\n"),
            "{output}"
        );
    }

    #[test]
    fn usage_errors_exit_2_without_calling_the_daemon() {
        let absent = "/nonexistent-storc-dir/api.sock";
        let (exit_code, output) = run_to_string(&["/c0", "add", "vd", "r7", "drives=0-3"], Some(absent));
        assert_eq!(exit_code, 2);
        let expected = "CLI Version = storc 0.1.0\nStatus = Failure\n\
                        Description = unknown RAID level \"r7\"; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod\n";
        assert_eq!(output, expected);
        let (exit_code, output) = run_to_string(&["/c1", "show", "J"], Some(absent));
        assert_eq!(exit_code, 2);
        let envelope: Value = serde_json::from_str(&output).unwrap();
        assert_eq!(envelope["Controllers"][0]["Command Status"]["Description"], "controller /c1 does not exist; storc has only /c0");
        assert_eq!(run_to_string(&["/c0", "show", "--api"], None).0, 2);
    }

    #[test]
    fn an_absent_daemon_says_how_to_start_it() {
        let (exit_code, output) = run_to_string(&["--api", "/nonexistent-storc-dir/api.sock", "/c0", "show"], Some("/other.sock"));
        assert_eq!(exit_code, 1);
        assert!(
            output.ends_with(
                "Status = Failure\nDescription = cannot reach the storc daemon at /nonexistent-storc-dir/api.sock \
             (No such file or directory); start it with: storc serve\n"
            ),
            "{output}"
        );
        assert!(!Path::new("/nonexistent-storc-dir").exists());
    }
}
