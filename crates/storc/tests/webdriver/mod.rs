//! A headless Chromium driven over WebDriver (W3C), for the console's browser test: Debian's
//! `chromedriver` (package chromium-driver) on a free loopback port, and the few WebDriver calls
//! the test makes, as raw JSON over HTTP/1.1.
//!
//! Why not a WebDriver client crate: the ones there are (fantoccini, thirtyfour) are async and
//! bring an HTTP client with a TLS stack, for calls that go to 127.0.0.1 only; the protocol part
//! used here is a dozen JSON requests.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The key under which WebDriver returns an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// From spawn until chromedriver answers /status.
const DRIVER_START_TIMEOUT: Duration = Duration::from_secs(20);
/// A WebDriver call waits this long for its answer (a page load included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Finds `name` on PATH, or fails the test saying which Debian package brings it.
pub fn require(name: &str, debian_package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| p.is_file()));
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not installed, and this test drives a real browser with it; install it with `apt-get install -y {debian_package}`"
        )
    })
}

/// A chromedriver process and one browser session; both end when dropped.
pub struct Browser {
    driver: Child,
    address: String,
    session: String,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile in `profile_dir`, its
    /// window `width` x `height` (screenshots are of the window).
    pub fn start(profile_dir: &Path, log_path: &Path, width: u32, height: u32) -> Browser {
        let chromium = require("chromium", "chromium");
        let chromedriver = require("chromedriver", "chromium-driver");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port();
        let log = std::fs::File::create(log_path).unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start chromedriver");
        let mut browser = Browser { driver, address: format!("127.0.0.1:{port}"), session: String::new() };
        browser.wait_until_ready();
        // Without the background-networking flags Chromium reaches for the network at start,
        // which a closed machine refuses; --no-sandbox because tests run as root.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--window-size={width},{height}"),
            &format!("--user-data-dir={}", profile_dir.display()),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium.display().to_string(), "args": args },
        }}});
        let answer = browser.call("POST", "/session", Some(&capabilities));
        browser.session = answer["sessionId"].as_str().unwrap_or_else(|| panic!("no sessionId in {answer}")).to_string();
        browser
    }

    fn wait_until_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Ok((200, body)) = http(&self.address, "GET", "/status", None) {
                if body["value"]["ready"] == json!(true) {
                    return;
                }
            }
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited with {status} before it was ready");
            }
            assert!(started.elapsed() < DRIVER_START_TIMEOUT, "chromedriver not ready within {DRIVER_START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One WebDriver command; its `value`. A WebDriver error fails the test with its message.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.try_call(method, path, body).unwrap_or_else(|(status, answer)| panic!("WebDriver {method} {path} answered {status}: {answer}"))
    }

    /// One WebDriver command: its `value`, or the status and answer of a WebDriver error.
    fn try_call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, (u16, Value)> {
        let (status, answer) = http(&self.address, method, path, body).unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        match status {
            200 => Ok(answer["value"].clone()),
            _ => Err((status, answer)),
        }
    }

    fn session_call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Clicks the first element matching `css`, waiting up to `timeout` for one. The page redraws
    /// parts of itself as the daemon's answers change, so an element found may be replaced before
    /// the click lands ("stale element reference"): then it is found again.
    pub fn click(&self, css: &str, timeout: Duration) {
        let started = Instant::now();
        loop {
            let element = self.wait_for(css, timeout);
            let path = format!("/session/{}/element/{}/click", self.session, element.id);
            match self.try_call("POST", &path, Some(&json!({}))) {
                Ok(_) => return,
                Err((_, answer)) if answer["value"]["error"] == json!("stale element reference") && started.elapsed() < timeout => continue,
                Err((status, answer)) => panic!("clicking {css:?} answered {status}: {answer}"),
            }
        }
    }

    /// The text content of the first element matching `css` now, if there is one (read in the
    /// page, so a redraw cannot come between finding it and reading it).
    pub fn text_of(&self, css: &str) -> Option<String> {
        let script = "const found = document.querySelector(arguments[0]); return found ? found.textContent : null;";
        self.execute(script, &[json!(css)]).as_str().map(str::to_string)
    }

    /// An attribute of every element matching `css` now (absent attributes left out).
    pub fn attributes_of(&self, css: &str, attribute: &str) -> Vec<String> {
        let script =
            "return [...document.querySelectorAll(arguments[0])].map((e) => e.getAttribute(arguments[1])).filter((v) => v !== null);";
        let values = self.execute(script, &[json!(css), json!(attribute)]);
        values.as_array().map(|list| list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default()
    }

    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// The elements matching a CSS selector now (perhaps none).
    pub fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found = self.session_call("POST", "/elements", Some(&json!({ "using": "css selector", "value": css })));
        let list = found.as_array().cloned().unwrap_or_default();
        list.iter().map(|e| Element { browser: self, id: e[ELEMENT_KEY].as_str().expect("an element reference").to_string() }).collect()
    }

    /// The first element matching `css`, waiting up to `timeout` for it to appear.
    pub fn wait_for(&self, css: &str, timeout: Duration) -> Element<'_> {
        let started = Instant::now();
        loop {
            if let Some(element) = self.find_all(css).into_iter().next() {
                return element;
            }
            assert!(started.elapsed() < timeout, "no element {css:?} within {timeout:?}; page text:\n{}", self.page_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs a script in the page; what it returns.
    pub fn execute(&self, script: &str, args: &[Value]) -> Value {
        self.session_call("POST", "/execute/sync", Some(&json!({ "script": script, "args": args })))
    }

    /// The visible text of the page, for failure messages.
    pub fn page_text(&self) -> String {
        self.execute("return document.body ? document.body.innerText : '';", &[]).as_str().unwrap_or_default().to_string()
    }

    /// A PNG of the window.
    pub fn screenshot_png(&self) -> Vec<u8> {
        use base64::Engine as _;
        let encoded = self.session_call("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD.decode(encoded.as_str().expect("a base64 screenshot")).expect("valid base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Ends Chromium; chromedriver itself is ours to kill.
            let _ = http(&self.address, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// An element of the page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Element<'_> {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.browser.session_call(method, &format!("/element/{}{path}", self.id), body)
    }

    pub fn click(&self) {
        self.call("POST", "/click", Some(&json!({})));
    }

    pub fn send_keys(&self, text: &str) {
        self.call("POST", "/value", Some(&json!({ "text": text })));
    }

    pub fn clear(&self) {
        self.call("POST", "/clear", Some(&json!({})));
    }

    pub fn text(&self) -> String {
        self.call("GET", "/text", None).as_str().unwrap_or_default().to_string()
    }

    /// An attribute (`data-percent`), or `None` without it.
    pub fn attribute(&self, name: &str) -> Option<String> {
        self.call("GET", &format!("/attribute/{name}"), None).as_str().map(str::to_string)
    }
}

/// One HTTP/1.1 request to chromedriver (JSON both ways): status and body. chromedriver keeps the
/// connection open after its answer, so the body is read by its Content-Length.
fn http(address: &str, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<(u16, Value)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(CALL_TIMEOUT))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json; charset=utf-8\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    let (head_end, length) = loop {
        if let Some(head_end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
            assert!(!head.contains("transfer-encoding: chunked"), "chromedriver sent a chunked answer: {head}");
            let length = head.lines().find_map(|line| line.strip_prefix("content-length:")?.trim().parse::<usize>().ok());
            break (head_end, length.unwrap_or(0));
        }
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "chromedriver closed before its headers ended"));
        }
        answer.extend_from_slice(&chunk[..read]);
    };
    while answer.len() < head_end + 4 + length {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "chromedriver closed within its body"));
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    let head = String::from_utf8_lossy(&answer[..head_end]).to_string();
    let body = &answer[head_end + 4..head_end + 4 + length];
    let malformed = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed answer: {head:?}"));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or_else(malformed)?;
    let value = if body.is_empty() { Value::Null } else { serde_json::from_slice(body).map_err(|_| malformed())? };
    Ok((status, value))
}
