//! Pre-shared keys in the file format of GnuTLS's `psktool`, which nbdkit (`--tls-psk`),
//! qemu-nbd (`tls-creds-psk`, `keys.psk`) and libnbd (`tls-psk-file=`) all read: one
//! `USERNAME:HEXKEY` per line, as `psktool -u alice -p keys.psk` writes it.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The longest key accepted: what psktool can make (`--keysize` up to 512 bytes) and what
/// OpenSSL 3 hands its PSK callbacks room for (PSK_MAX_PSK_LEN).
pub const PSK_KEY_MAX_BYTES: usize = 512;
/// The longest user name accepted: OpenSSL's PSK_MAX_IDENTITY_LEN, less the NUL it appends.
pub const PSK_USERNAME_MAX_BYTES: usize = 255;

/// The form of one line, for error messages.
const LINE_FORM: &str = "USERNAME:HEXKEY (as `psktool -u USERNAME -p FILE` writes), e.g. alice:9d2c...";

/// The keys of a PSK file, by user name.
#[derive(Clone, Default)]
pub struct PskKeys {
    keys: HashMap<String, Vec<u8>>,
}

impl fmt::Debug for PskKeys {
    /// Names the users, never the keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut users: Vec<&String> = self.keys.keys().collect();
        users.sort();
        f.debug_struct("PskKeys").field("users", &users).finish()
    }
}

impl PskKeys {
    /// Reads and parses a PSK file.
    ///
    /// # Errors
    /// The file cannot be read, a line is malformed (named by number, with the allowed form),
    /// a user is named twice, or the file holds no key.
    pub fn load(path: &Path) -> Result<PskKeys, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read PSK file {}: {error}", path.display()))?;
        PskKeys::parse(&text).map_err(|problem| format!("PSK file {}: {problem}", path.display()))
    }

    /// Parses the text of a PSK file. Blank lines are skipped; every other line is a key.
    ///
    /// # Errors
    /// As [`PskKeys::load`], without the file name.
    pub fn parse(text: &str) -> Result<PskKeys, String> {
        let mut keys = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let line_number = index + 1;
            let (username, key) = parse_line(line).map_err(|problem| format!("line {line_number}: {problem}; allowed: {LINE_FORM}"))?;
            if keys.insert(username.to_string(), key).is_some() {
                return Err(format!("line {line_number}: user {username:?} is named twice; allowed: one line per user"));
            }
        }
        if keys.is_empty() {
            return Err(format!("holds no key; allowed: one or more lines {LINE_FORM}"));
        }
        Ok(PskKeys { keys })
    }

    /// A single user's key, for a client.
    pub fn single(username: &str, key: Vec<u8>) -> PskKeys {
        PskKeys { keys: HashMap::from([(username.to_string(), key)]) }
    }

    pub fn key(&self, username: &str) -> Option<&[u8]> {
        self.keys.get(username).map(Vec::as_slice)
    }

    pub fn usernames(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }
}

fn parse_line(line: &str) -> Result<(&str, Vec<u8>), String> {
    let Some((username, hex)) = line.split_once(':') else {
        return Err("no ':' between user name and key".into());
    };
    if username.is_empty() {
        return Err("the user name is empty".into());
    }
    if username.len() > PSK_USERNAME_MAX_BYTES {
        return Err(format!("the user name is {} bytes, at most {PSK_USERNAME_MAX_BYTES} allowed", username.len()));
    }
    if username.chars().any(char::is_control) {
        return Err("the user name holds a control character".into());
    }
    let key = decode_hex(hex.trim())?;
    if key.is_empty() || key.len() > PSK_KEY_MAX_BYTES {
        return Err(format!("the key is {} bytes; allowed: 1 to {PSK_KEY_MAX_BYTES} bytes", key.len()));
    }
    Ok((username, key))
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("the key has {} hex digits, an odd number", hex.len()));
    }
    let digit = |byte: u8| char::from(byte).to_digit(16).map(|value| value as u8);
    hex.as_bytes()
        .chunks(2)
        .map(|pair| match (digit(pair[0]), digit(pair[1])) {
            (Some(high), Some(low)) => Ok(high << 4 | low),
            _ => Err(format!("the key holds {:?}, which is not hex", String::from_utf8_lossy(pair))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psktool_lines_parse() {
        let keys = PskKeys::parse("alice:00ff10\n\nbob:ABCDEF\r\n").unwrap();
        assert_eq!(keys.key("alice"), Some(&[0x00, 0xff, 0x10][..]));
        assert_eq!(keys.key("bob"), Some(&[0xab, 0xcd, 0xef][..]));
        assert_eq!(keys.key("carol"), None);
        assert_eq!(format!("{keys:?}"), "PskKeys { users: [\"alice\", \"bob\"] }", "Debug must not show keys");
    }

    #[test]
    fn malformed_lines_are_named_with_the_allowed_form() {
        for (text, problem) in [
            ("alice:00\nbob 00ff\n", "line 2: no ':' between user name and key"),
            (":00ff", "line 1: the user name is empty"),
            ("alice:0f0", "line 1: the key has 3 hex digits, an odd number"),
            ("alice:zz", "line 1: the key holds \"zz\", which is not hex"),
            ("alice:", "line 1: the key is 0 bytes; allowed: 1 to 512 bytes"),
        ] {
            let error = PskKeys::parse(text).unwrap_err();
            assert!(error.starts_with(problem), "{text:?}: {error}");
            assert!(error.ends_with(LINE_FORM) || error.contains("allowed: 1 to 512"), "{text:?}: {error}");
        }
        assert!(PskKeys::parse("a:00\na:01").unwrap_err().contains("user \"a\" is named twice"));
        assert!(PskKeys::parse("\n\n").unwrap_err().starts_with("holds no key"));
        assert!(PskKeys::parse(&format!("a:{}", "00".repeat(513))).unwrap_err().contains("513 bytes"));
    }
}
