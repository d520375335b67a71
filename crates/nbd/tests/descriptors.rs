//! Descriptors per connection, counted in /proc/self/fd: alone in its test binary, because the
//! count is of the whole process and other tests would open descriptors meanwhile.

mod common;

use std::time::Duration;

use common::*;
use nbd::{Client, ClientConfig, DESCRIPTORS_PER_CONNECTION};

fn open_descriptor_count() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd").count()
}

/// Regression: each connection held six descriptors (clones of its socket), so 255 idle
/// connections exhausted a 1024-descriptor limit and the management API stopped answering.
/// The daemon reserves `DESCRIPTORS_PER_CONNECTION` per allowed connection: it must be true.
#[test]
fn a_connection_costs_the_server_the_descriptors_it_declares() {
    const CONNECTIONS: usize = 20;
    let dir = TempDir::new("descriptors");
    let (handle, _device) = serve_mem(&dir, "vd0", MIB);
    let before_count = open_descriptor_count();
    let mut clients: Vec<Client> =
        (0..CONNECTIONS).map(|_| Client::connect(&handle.uri("vd0"), &ClientConfig::default()).unwrap()).collect();
    for client in &mut clients {
        client.read(0, 512).unwrap(); // in the transmission phase, with its writer thread running
    }
    assert!(wait_until(Duration::from_secs(10), || handle.connections_open() == CONNECTIONS));
    let client_descriptors = 1; // this crate's client shares one socket between reading and writing
    let opened_count = open_descriptor_count() - before_count;
    assert_eq!(
        opened_count,
        CONNECTIONS * (client_descriptors + DESCRIPTORS_PER_CONNECTION),
        "descriptors opened by {CONNECTIONS} connections"
    );
}
