//! The management API's token: what a client over TCP must show, since any local process can
//! connect to a loopback port and a web page can make the browser send requests there.
//!
//! 256 random bits (the kernel's `getrandom`), written as 64 hex digits into `<data-dir>/api.token`
//! (0600, in the 0700 data directory) at the first start and read at every later one, so that a
//! restart keeps it. Only someone who can read the data directory (its owner, root) learns it.
//! The Unix socket needs none: it is owner-only in that same directory.
//!
//! A request shows it as `Authorization: Bearer TOKEN`, or as the cookie `storc_token` that the
//! console's login sets (HttpOnly: the page's scripts never see it; SameSite=Strict: a request
//! another site makes the browser send carries no cookie; Secure over HTTPS: the browser never
//! sends it over plain HTTP, where anyone on the way could read it).

use axum::http::{header, HeaderMap};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub const TOKEN_FILE_NAME: &str = "api.token";
/// The cookie the console's login sets.
pub const COOKIE_NAME: &str = "storc_token";
const TOKEN_BYTES: usize = 32;
const TOKEN_HEX_DIGITS: usize = TOKEN_BYTES * 2;

pub struct ApiToken {
    hex: String,
    /// Where it is kept, for the messages that tell a client where to find it.
    path: PathBuf,
}

impl ApiToken {
    /// Reads `<data_dir>/api.token`, or creates it with a new random token if there is none.
    ///
    /// # Errors
    /// The file cannot be read or created, or does not hold a token (64 hex digits).
    pub fn load_or_create(data_dir: &Path) -> Result<ApiToken, String> {
        let path = data_dir.join(TOKEN_FILE_NAME);
        match std::fs::read_to_string(&path) {
            Ok(text) => parse(text.trim()).map(|hex| ApiToken { hex, path: path.clone() }).ok_or_else(|| {
                format!(
                    "{} does not hold an API token ({TOKEN_HEX_DIGITS} hex digits); remove it and storc serve writes a new one",
                    path.display()
                )
            }),
            Err(error) if error.kind() == ErrorKind::NotFound => create(&path),
            Err(error) => Err(format!("cannot read the API token {}: {error}", path.display())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `candidate` is the token, in time that does not depend on where they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        let (expected, candidate) = (self.hex.as_bytes(), candidate.as_bytes());
        // The length is public (always 64); only the contents must not leak through timing.
        expected.len() == candidate.len() && expected.iter().zip(candidate).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    /// Whether the request carries the token, in its Authorization header or its cookie.
    pub fn presented_in(&self, headers: &HeaderMap) -> Presented {
        let mut presented = Presented::Nothing;
        for candidate in bearer_tokens(headers).chain(cookie_tokens(headers)) {
            if self.matches(candidate) {
                return Presented::Token;
            }
            presented = Presented::WrongToken;
        }
        presented
    }

    #[cfg(test)]
    pub fn for_tests(hex: String) -> ApiToken {
        ApiToken { hex, path: PathBuf::from("/data/api.token") }
    }

    /// The `Set-Cookie` value of a login: the token for every path of this listener; `Secure`
    /// when it is served over HTTPS.
    pub fn login_cookie(&self, https: bool) -> String {
        format!("{COOKIE_NAME}={}; Path=/; HttpOnly; SameSite=Strict{}", self.hex, secure_attribute(https))
    }
}

/// What a request showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presented {
    Nothing,
    WrongToken,
    Token,
}

/// The `Set-Cookie` value of a logout: the cookie expires at once.
pub fn logout_cookie(https: bool) -> String {
    format!("{COOKIE_NAME}=; Path=/; HttpOnly; SameSite=Strict{}; Max-Age=0", secure_attribute(https))
}

fn secure_attribute(https: bool) -> &'static str {
    if https {
        "; Secure"
    } else {
        ""
    }
}

/// The token, if `text` is one.
fn parse(text: &str) -> Option<String> {
    (text.len() == TOKEN_HEX_DIGITS && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| text.to_string())
}

fn create(path: &Path) -> Result<ApiToken, String> {
    let mut random = [0u8; TOKEN_BYTES];
    getrandom::getrandom(&mut random).map_err(|error| format!("cannot draw random bytes for the API token: {error}"))?;
    let hex: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
    // create_new: never overwrite a token another start wrote meanwhile; 0600 whatever the umask
    // (the directory is 0700 already, so no other user sees it in between either).
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(super::data_dir::FILE_MODE)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{hex}\n").as_bytes()).and_then(|()| file.sync_all()));
    written.map_err(|error| format!("cannot write the API token {}: {error}", path.display()))?;
    tracing::info!("wrote a new management API token to {}", path.display());
    Ok(ApiToken { hex, path: path.to_path_buf() })
}

/// `Authorization: Bearer TOKEN` (the scheme's case does not matter, RFC 9110 11.1).
fn bearer_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers.get_all(header::AUTHORIZATION).iter().filter_map(|value| {
        let (scheme, token) = value.to_str().ok()?.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
    })
}

/// `Cookie: a=1; storc_token=TOKEN`, over every Cookie header.
fn cookie_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("storc-token-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn created_once_owner_only_and_kept() {
        let dir = scratch("create");
        let token = ApiToken::load_or_create(&dir).unwrap();
        let path = dir.join(TOKEN_FILE_NAME);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64, "{text:?}");
        assert!(token.matches(text.trim()));
        let again = ApiToken::load_or_create(&dir).unwrap();
        assert!(again.matches(text.trim()), "a restart keeps the token");
        let other_dir = scratch("other");
        assert!(!ApiToken::load_or_create(&other_dir).unwrap().matches(text.trim()), "every data directory draws its own");
        std::fs::write(&path, "not a token\n").unwrap();
        let error = ApiToken::load_or_create(&dir).err().unwrap();
        assert!(error.ends_with("does not hold an API token (64 hex digits); remove it and storc serve writes a new one"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&other_dir);
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn presented_as_bearer_or_cookie() {
        let hex = "0123456789abcdef".repeat(4);
        let token = ApiToken { hex: hex.clone(), path: PathBuf::from("api.token") };
        let wrong = "f".repeat(64);
        let check = |pairs: &[(header::HeaderName, &str)], expected| assert_eq!(token.presented_in(&headers(pairs)), expected, "{pairs:?}");
        check(&[], Presented::Nothing);
        check(&[(header::AUTHORIZATION, &format!("Bearer {hex}"))], Presented::Token);
        check(&[(header::AUTHORIZATION, &format!("bearer {hex}"))], Presented::Token);
        check(&[(header::AUTHORIZATION, &format!("Basic {hex}"))], Presented::Nothing);
        check(&[(header::AUTHORIZATION, &format!("Bearer {wrong}"))], Presented::WrongToken);
        check(&[(header::AUTHORIZATION, &format!("Bearer {}", &hex[..63]))], Presented::WrongToken);
        check(&[(header::COOKIE, &format!("theme=dark; storc_token={hex}"))], Presented::Token);
        check(&[(header::COOKIE, "storc_token_old=1"), (header::COOKIE, &format!("storc_token={hex}"))], Presented::Token);
        check(&[(header::COOKIE, &format!("storc_token={wrong}"))], Presented::WrongToken);
        check(&[(header::COOKIE, &format!("xstorc_token={hex}"))], Presented::Nothing);
        assert_eq!(token.login_cookie(false), format!("storc_token={hex}; Path=/; HttpOnly; SameSite=Strict"));
        assert_eq!(token.login_cookie(true), format!("storc_token={hex}; Path=/; HttpOnly; SameSite=Strict; Secure"));
        assert_eq!(logout_cookie(true), "storc_token=; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age=0");
    }
}
