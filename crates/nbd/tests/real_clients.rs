//! The server against real NBD clients: nbdinfo, nbdcopy, qemu-img and fio. These tools must be
//! installed (`apt-get install -y libnbd-bin qemu-utils fio`); a missing one fails the test.

mod common;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use nbd::testing::MemDevice;
use nbd::{BlockDevice, Done, Export, ReadDone, Server};

#[test]
fn nbdinfo_list_shows_both_exports_with_their_sizes() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("list");
    let server = Server::new(vec![
        Export::new("vd0", Arc::new(MemDevice::new(64 * MIB))).with_description("RAID 5, 3 drives"),
        Export::new("vd1", Arc::new(MemDevice::new(16 * MIB))),
    ])
    .unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    let listing = stdout(&run(Command::new("nbdinfo").arg("--list").arg(handle.uri("").to_string())));
    let vd0 = section(&listing, "export=\"vd0\":");
    let vd1 = section(&listing, "export=\"vd1\":");
    assert!(vd0.contains("export-size: 67108864"), "{listing}");
    assert!(vd0.contains("description: RAID 5, 3 drives"), "{listing}");
    assert!(vd1.contains("export-size: 16777216"), "{listing}");
}

/// The lines of `text` from `heading` up to the next export heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(heading).unwrap_or_else(|| panic!("no {heading} in:\n{text}"));
    let rest = &text[start + heading.len()..];
    &rest[..rest.find("export=").unwrap_or(rest.len())]
}

#[test]
fn nbdinfo_shows_block_size_constraints_and_flags() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("info");
    let (handle, _device) = serve_mem(&dir, "vd0", 64 * MIB);
    let info = stdout(&run(Command::new("nbdinfo").arg(handle.uri("vd0").to_string())));
    for expected in [
        "export-size: 67108864",
        "block_size_minimum: 512",
        "block_size_preferred: 4096",
        "block_size_maximum: 33554432",
        "can_flush: true",
        "can_fua: true",
        "can_trim: true",
        "can_zero: true",
        "can_multi_conn: true",
    ] {
        assert!(info.contains(expected), "missing {expected:?} in:\n{info}");
    }
}

#[test]
fn nbdinfo_works_over_tcp() {
    require_tool("nbdinfo", "libnbd-bin");
    let device = Arc::new(MemDevice::new(8 * MIB));
    let server = Server::new(vec![Export::new("vd0", device)]).unwrap();
    // Port 0: the kernel picks a free port, so parallel tests never collide.
    let handle = server.serve_tcp("127.0.0.1:0").unwrap();
    let uri = handle.uri("vd0").to_string();
    assert!(uri.starts_with("nbd://127.0.0.1:"), "{uri}");
    let info = stdout(&run(Command::new("nbdinfo").arg(&uri)));
    assert!(info.contains("export-size: 8388608"), "{info}");
}

#[test]
fn nbdcopy_round_trips_64_mib() {
    require_tool("nbdcopy", "libnbd-bin");
    let dir = TempDir::new("nbdcopy");
    let (handle, device) = serve_mem(&dir, "vd0", 64 * MIB);
    let data = random_bytes(64 * MIB as usize, 1);
    let source = dir.join("source.img");
    let copy_back = dir.join("copy-back.img");
    std::fs::write(&source, &data).unwrap();
    let uri = handle.uri("vd0").to_string();
    run(Command::new("nbdcopy").arg(&source).arg(&uri));
    assert!(device.snapshot(0, data.len()) == data, "the export differs from the source after nbdcopy in");
    run(Command::new("nbdcopy").arg(&uri).arg(&copy_back));
    assert!(std::fs::read(&copy_back).unwrap() == data, "the copy read back differs from the source");
}

#[test]
fn qemu_img_convert_then_compare_matches() {
    require_tool("qemu-img", "qemu-utils");
    let dir = TempDir::new("qemu-img");
    let (handle, _device) = serve_mem(&dir, "vd0", 32 * MIB);
    let image = dir.join("image.raw");
    std::fs::write(&image, random_bytes(32 * MIB as usize, 2)).unwrap();
    let uri = handle.uri("vd0").to_string();
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&image).arg(&uri));
    let compare = stdout(&run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&image).arg(&uri)));
    assert!(compare.contains("Images are identical"), "{compare}");
}

fn fio_randrw_verify(uri: &str) -> Command {
    let mut fio = Command::new("fio");
    fio.arg("--name=storc-nbd")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .args(["--rw=randrw", "--bs=4k", "--iodepth=32", "--size=32m"])
        .args(["--verify=crc32c", "--verify_fatal=1", "--do_verify=1"]);
    fio
}

#[test]
fn fio_randrw_with_crc32c_verify_passes() {
    require_tool("fio", "fio");
    let dir = TempDir::new("fio");
    let (handle, device) = serve_mem(&dir, "vd0", 32 * MIB);
    let report = stdout(&run(&mut fio_randrw_verify(&handle.uri("vd0").to_string())));
    assert!(report.contains("err= 0"), "{report}");
    assert!(device.counters().writes.load(Ordering::Relaxed) > 0, "fio wrote nothing:\n{report}");
}

/// The control for the test above: fio's verify must catch a device that returns wrong data,
/// or passing it would prove nothing.
#[test]
fn fio_verify_catches_a_device_that_corrupts_reads() {
    require_tool("fio", "fio");
    let dir = TempDir::new("fio-corrupt");
    let device = Arc::new(CorruptingDevice(MemDevice::new(32 * MIB)));
    let server = Server::new(vec![Export::new("vd0", device)]).unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    let output = fio_randrw_verify(&handle.uri("vd0").to_string()).output().unwrap();
    assert!(!output.status.success(), "fio passed verification against corrupted reads");
}

/// Flips one bit of every read.
struct CorruptingDevice(MemDevice);

impl BlockDevice for CorruptingDevice {
    type Buf = Vec<u8>;
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn block_size_bytes(&self) -> u32 {
        self.0.block_size_bytes()
    }
    fn alloc(&self, len_bytes: usize) -> Vec<u8> {
        self.0.alloc(len_bytes)
    }
    fn flush_is_global(&self) -> bool {
        true
    }
    fn supports_trim(&self) -> bool {
        true
    }
    fn read(&self, offset: u64, buf: Vec<u8>, done: ReadDone<Vec<u8>>) {
        self.0.read(
            offset,
            buf,
            Box::new(move |result| {
                done(result.map(|mut buf| {
                    buf[100] ^= 1;
                    buf
                }))
            }),
        );
    }
    fn write(&self, offset: u64, buf: Vec<u8>, fua: bool, done: Done) {
        self.0.write(offset, buf, fua, done)
    }
    fn flush(&self, done: Done) {
        self.0.flush(done)
    }
    fn trim(&self, offset: u64, len_bytes: u64, done: Done) {
        self.0.trim(offset, len_bytes, done)
    }
    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        self.0.write_zeroes(offset, len_bytes, fua, done)
    }
}
