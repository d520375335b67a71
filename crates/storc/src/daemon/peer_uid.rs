//! Which local user owns the other end of a loopback TCP connection.
//!
//! A Unix socket tells the server its peer's uid (SO_PEERCRED); TCP does not, even over loopback.
//! The kernel lists every TCP socket of this network namespace with its owner's uid in
//! /proc/net/tcp and /proc/net/tcp6, so the client's socket is the line whose local address is our
//! peer and whose remote address is our end of the connection.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The kernel's socket tables, IPv4 then IPv6 (a kernel without IPv6 has no tcp6).
const PROC_NET_TCP_PATHS: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// One line of /proc/net/tcp: the fields this module needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSocketLine {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub uid: u32,
}

/// The uid owning the client socket of the connection from `peer` to `local` (our end); `None`
/// when no socket matches (the client has already gone).
///
/// # Errors
/// A socket table that exists but cannot be read.
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> io::Result<Option<u32>> {
    for path in PROC_NET_TCP_PATHS {
        let table = match std::fs::read_to_string(path) {
            Ok(table) => table,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io::Error::new(error.kind(), format!("{path}: {error}"))),
        };
        if let Some(uid) = owner_in_table(&table, peer, local) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

/// The uid of the socket in `table` (a whole /proc/net/tcp or tcp6) bound to `client` and
/// connected to `server`.
pub fn owner_in_table(table: &str, client: SocketAddr, server: SocketAddr) -> Option<u32> {
    // The first line is the column heading.
    table
        .lines()
        .skip(1)
        .filter_map(parse_line)
        .find(|line| same_end(line.local, client) && same_end(line.remote, server))
        .map(|line| line.uid)
}

/// Addresses as the kernel sees them: an IPv4 client of a dual-stack socket is `::ffff:a.b.c.d`
/// in tcp6, and the flow label and scope id of an accepted address are not in the table.
fn same_end(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip().to_canonical() == b.ip().to_canonical() && a.port() == b.port()
}

/// `   3: 0100007F:CCFE 0100007F:E25D 01 00000000:00000000 00:00000000 00000000 65534 ...`:
/// slot, local address, remote address, state, queues, timer, retransmits, uid, ...
pub fn parse_line(line: &str) -> Option<TcpSocketLine> {
    const LOCAL_FIELD: usize = 1;
    const REMOTE_FIELD: usize = 2;
    const UID_FIELD: usize = 7;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let uid = fields.get(UID_FIELD)?.parse().ok()?;
    Some(TcpSocketLine { local: parse_address(fields[LOCAL_FIELD])?, remote: parse_address(fields[REMOTE_FIELD])?, uid })
}

/// `0100007F:E25D` (127.0.0.1:57949) or `00000000000000000000000001000000:8BFD` ([::1]:35837).
pub fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip_hex, port_hex) = text.split_once(':')?;
    if !ip_hex.is_ascii() {
        return None;
    }
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let ip = match ip_hex.len() {
        8 => IpAddr::V4(Ipv4Addr::from(address_word(ip_hex)?)),
        32 => {
            let mut octets = [0u8; 16];
            for (index, chunk) in octets.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&address_word(&ip_hex[index * 8..index * 8 + 8])?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Four bytes of an address. The kernel prints each 32-bit word of the address, which is in
/// network byte order in memory, as a host-order integer (`%08X`), so the bytes are the word's
/// native-endian bytes: `0100007F` is 127.0.0.1 on a little-endian host. Ports are printed after
/// ntohs and need no swap.
fn address_word(hex: &str) -> Option<[u8; 4]> {
    u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines captured on a little-endian (x86-64) host, as every target storc builds for: a root
    // listener, its accepted socket, and the client socket of uid 65534.
    const TCP4: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   1: 0100007F:E25D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 15187 1 0000000080b5b8b6 100 0 0 10 0
   2: 0100007F:E25D 0100007F:CCFE 01 00000000:00000000 00:00000000 00000000     0        0 15189 1 000000009a6ec995 20 0 0 10 -1
   3: 0100007F:CCFE 0100007F:E25D 01 00000000:00000000 00:00000000 00000000 65534        0 15196 2 00000000fc3023bf 20 0 0 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:8BFD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 15176 1 0000000078d0dfc1 100 0 0 10 0
   1: 00000000000000000000000001000000:8BFD 00000000000000000000000001000000:ED18 01 00000000:00000000 00:00000000 00000000     0        0 15185 1 00000000dcf6f792 20 0 0 10 -1
   2: 00000000000000000000000001000000:ED18 00000000000000000000000001000000:8BFD 01 00000000:00000000 00:00000000 00000000 65534        0 15184 2 000000001fb6395c 20 0 0 10 -1
";

    fn address(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn check_address(hex: &str, expected: Option<&str>) {
        assert_eq!(parse_address(hex), expected.map(address), "parse_address({hex:?})");
    }

    #[test]
    fn addresses_in_both_formats() {
        check_address("0100007F:E25D", Some("127.0.0.1:57949"));
        check_address("0200007F:0050", Some("127.0.0.2:80"));
        check_address("020200C0:D89A", Some("192.0.2.2:55450"));
        check_address("00000000:0000", Some("0.0.0.0:0"));
        check_address("00000000000000000000000001000000:8BFD", Some("[::1]:35837"));
        check_address("0000000000000000FFFF00000100007F:2382", Some("[::ffff:127.0.0.1]:9090"));
        check_address("B80D0120000000000000000001000000:0016", Some("[2001:db8::1]:22"));
        check_address("0100007F", None);
        check_address("0100007:E25D", None);
        check_address("0100007G:E25D", None);
        check_address("0100007F:1E25D", None);
        check_address("ééé00007F:E25D", None);
    }

    #[test]
    fn lines_give_both_ends_and_the_owner() {
        let line = "   3: 0100007F:CCFE 0100007F:E25D 01 00000000:00000000 00:00000000 00000000 65534        0 15196 2 0 20 0 0 10 -1";
        let expected = TcpSocketLine { local: address("127.0.0.1:52478"), remote: address("127.0.0.1:57949"), uid: 65534 };
        assert_eq!(parse_line(line), Some(expected));
        assert_eq!(parse_line("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"), None);
        assert_eq!(parse_line("   3: 0100007F:CCFE 0100007F:E25D 01"), None);
        assert_eq!(parse_line(""), None);
    }

    #[test]
    fn the_client_socket_is_found_not_the_accepted_one() {
        let (client, server) = (address("127.0.0.1:52478"), address("127.0.0.1:57949"));
        assert_eq!(owner_in_table(TCP4, client, server), Some(65534));
        // Our own accepted socket is the reverse pair, owned by the daemon.
        assert_eq!(owner_in_table(TCP4, server, client), Some(0));
        assert_eq!(owner_in_table(TCP4, address("127.0.0.1:52479"), server), None);
        let (client6, server6) = (address("[::1]:60696"), address("[::1]:35837"));
        assert_eq!(owner_in_table(TCP6, client6, server6), Some(65534));
        assert_eq!(owner_in_table(TCP6, client, server), None);
        let scoped: SocketAddr = std::net::SocketAddrV6::new("::1".parse().unwrap(), 60696, 7, 0).into();
        assert_eq!(owner_in_table(TCP6, scoped, server6), Some(65534), "the flow label is not in the table");
    }

    #[test]
    fn a_live_loopback_connection_is_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(peer_uid(peer, listener.local_addr().unwrap()).unwrap(), Some(uid));
    }
}
