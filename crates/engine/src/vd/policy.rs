//! A VD's cache policies, changeable live, and its read-ahead: which reads belong to a
//! sequential stream and how far ahead of each stream data is read into the cache.
//!
//! The stream table is the VD's, not a shard's: a stream crosses shards every
//! [`crate::SHARD_STRIDE_BYTES`], and only the submitting side sees all of it in order. It is
//! kept by end offset, as Linux's and ZFS's prefetchers do: a read that starts where a tracked
//! stream ended (give or take its own length, for requests that arrive slightly out of order at
//! a queue depth above one) continues that stream; any other read replaces the stream used
//! longest ago. Under ADRA a stream reads ahead from its second read on, its window doubling
//! each time the reader comes within half a window of the end, up to [`ADRA_WINDOW_MAX_BYTES`];
//! under RA every read reads the configured amount past its end. A random reader therefore
//! costs ADRA nothing but one table look-up per read.

use crate::config::{IoPolicy, ReadPolicy, WritePolicy};
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Sequential streams tracked per VD (seed 003's controller tracks several; bcache and ZFS
/// keep 8 to 16).
pub const STREAMS_TRACKED: usize = 16;
/// The first read-ahead window of an ADRA stream, unless its requests are larger.
pub const ADRA_WINDOW_MIN_BYTES: u64 = 128 << 10;
/// The largest read-ahead window of an ADRA stream.
pub const ADRA_WINDOW_MAX_BYTES: u64 = 4 << 20;
/// How far RA reads past every read unless the controller says otherwise.
pub const DEFAULT_READ_AHEAD_BYTES: u64 = 256 << 10;

/// The policies the cache applies to one VD. Each takes effect for the next request a shard
/// serves. The atomics come first (`repr(C)`): every request reads them, next to the
/// other fields of its [`crate::VirtualDrive`] that it reads.
#[repr(C)]
pub struct Policies {
    write: AtomicU8,
    read: AtomicU8,
    io: AtomicU8,
    streams: Mutex<Streams>,
}

impl Default for Policies {
    fn default() -> Self {
        Policies { write: AtomicU8::new(0), read: AtomicU8::new(0), io: AtomicU8::new(0), streams: Mutex::new(Streams::default()) }
    }
}

fn index_of<T: PartialEq>(all: &[T], value: &T) -> u8 {
    all.iter().position(|v| v == value).expect("every policy is listed") as u8
}

impl Policies {
    pub fn write(&self) -> WritePolicy {
        WritePolicy::ALL[usize::from(self.write.load(Ordering::Relaxed))]
    }

    pub fn set_write(&self, policy: WritePolicy) {
        self.write.store(index_of(&WritePolicy::ALL, &policy), Ordering::Relaxed);
    }

    pub fn read(&self) -> ReadPolicy {
        ReadPolicy::ALL[usize::from(self.read.load(Ordering::Relaxed))]
    }

    pub fn set_read(&self, policy: ReadPolicy) {
        self.read.store(index_of(&ReadPolicy::ALL, &policy), Ordering::Relaxed);
    }

    pub fn io(&self) -> IoPolicy {
        IoPolicy::ALL[usize::from(self.io.load(Ordering::Relaxed))]
    }

    pub fn set_io(&self, policy: IoPolicy) {
        self.io.store(index_of(&IoPolicy::ALL, &policy), Ordering::Relaxed);
    }

    /// Notes a client read of `range` of a VD of `capacity_bytes`, and returns what to read
    /// ahead of it now, if anything; RA reads `ra_bytes` past every read.
    pub fn read_ahead(&self, range: Range<u64>, capacity_bytes: u64, ra_bytes: u64) -> Option<Range<u64>> {
        let window = match self.read() {
            ReadPolicy::NoReadAhead => return None,
            ReadPolicy::ReadAhead => Window::Fixed(ra_bytes),
            ReadPolicy::Adaptive => Window::Growing,
        };
        let ahead = self.streams.lock().expect("read-ahead streams poisoned").note(range, window)?;
        let ahead = ahead.start..ahead.end.min(capacity_bytes);
        (ahead.start < ahead.end).then_some(ahead)
    }
}

#[derive(Clone, Copy)]
enum Window {
    /// RA: this much past every read.
    Fixed(u64),
    /// ADRA: only for streams, growing.
    Growing,
}

#[derive(Clone, Debug)]
struct Stream {
    /// Where the stream's last read ended.
    next_offset: u64,
    /// Where the read-ahead issued for it ends.
    ahead_to: u64,
    window_bytes: u64,
    /// Reads that continued the stream.
    continued: u64,
    last_use: u64,
}

#[derive(Default)]
struct Streams {
    streams: Vec<Stream>,
    clock: u64,
}

impl Streams {
    fn note(&mut self, range: Range<u64>, window: Window) -> Option<Range<u64>> {
        self.clock += 1;
        let len = range.end - range.start;
        let clock = self.clock;
        let found = self.streams.iter().position(|s| range.start + len >= s.next_offset && range.start <= s.next_offset + len);
        let stream = match found {
            Some(index) => {
                let stream = &mut self.streams[index];
                stream.continued += 1;
                stream.next_offset = stream.next_offset.max(range.end);
                stream
            }
            None => self.replace_oldest(Stream {
                next_offset: range.end,
                ahead_to: range.end,
                window_bytes: (4 * len).clamp(ADRA_WINDOW_MIN_BYTES, ADRA_WINDOW_MAX_BYTES),
                continued: 0,
                last_use: clock,
            }),
        };
        stream.last_use = clock;
        let window_bytes = match window {
            Window::Fixed(bytes) => bytes,
            Window::Growing if stream.continued == 0 => return None,
            Window::Growing => stream.window_bytes,
        };
        // Read ahead again once the reader is within half a window of the end of the last one.
        if stream.ahead_to >= range.end + window_bytes / 2 {
            return None;
        }
        let ahead = stream.ahead_to.max(range.end)..range.end + window_bytes;
        stream.ahead_to = ahead.end;
        if matches!(window, Window::Growing) {
            stream.window_bytes = (stream.window_bytes * 2).min(ADRA_WINDOW_MAX_BYTES);
        }
        assert!(ahead.start >= range.end, "read-ahead starts past the read");
        (ahead.start < ahead.end).then_some(ahead)
    }

    fn replace_oldest(&mut self, stream: Stream) -> &mut Stream {
        if self.streams.len() < STREAMS_TRACKED {
            self.streams.push(stream);
            return self.streams.last_mut().expect("just pushed");
        }
        let oldest = (0..self.streams.len()).min_by_key(|&i| self.streams[i].last_use).expect("a full table");
        self.streams[oldest] = stream;
        &mut self.streams[oldest]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(read: ReadPolicy) -> Policies {
        let policies = Policies::default();
        policies.set_read(read);
        policies
    }

    const CAPACITY: u64 = 1 << 40;
    const K64: u64 = 64 << 10;
    const RA: u64 = 4 * K64;

    #[test]
    fn nora_never_reads_ahead() {
        let p = policies(ReadPolicy::NoReadAhead);
        assert!((0..100).all(|i| p.read_ahead(i * K64..(i + 1) * K64, CAPACITY, RA).is_none()));
    }

    #[test]
    fn adra_reads_ahead_from_a_streams_second_read_with_a_growing_window() {
        let p = policies(ReadPolicy::Adaptive);
        assert_eq!(p.read_ahead(0..K64, CAPACITY, RA), None, "one read is not a stream");
        let first = p.read_ahead(K64..2 * K64, CAPACITY, RA).expect("the second read continues the stream");
        assert_eq!(first, 2 * K64..2 * K64 + 4 * K64);
        let mut issued = vec![first];
        let mut farthest_ahead = 0;
        for i in 2..200 {
            if let Some(ahead) = p.read_ahead(i * K64..(i + 1) * K64, CAPACITY, RA) {
                assert_eq!(ahead.start, issued.last().unwrap().end, "read-ahead continues where the last ended");
                farthest_ahead = farthest_ahead.max(ahead.end - (i + 1) * K64);
                issued.push(ahead);
            }
        }
        assert_eq!(farthest_ahead, ADRA_WINDOW_MAX_BYTES, "the window grows to its limit");
        assert!(issued.len() < 20, "read-ahead comes in large pieces, not per read: {}", issued.len());
    }

    #[test]
    fn adra_follows_as_many_streams_as_it_tracks_and_ignores_random_reads() {
        let p = policies(ReadPolicy::Adaptive);
        let base = |s: u64| s * (1 << 30);
        let mut ahead_per_stream = [0u32; STREAMS_TRACKED];
        for i in 0..50 {
            for s in 0..STREAMS_TRACKED as u64 {
                if p.read_ahead(base(s) + i * K64..base(s) + (i + 1) * K64, CAPACITY, RA).is_some() {
                    ahead_per_stream[s as usize] += 1;
                }
            }
        }
        assert!(ahead_per_stream.iter().all(|&n| n > 0), "every stream reads ahead: {ahead_per_stream:?}");
        let random = policies(ReadPolicy::Adaptive);
        let mut x: u64 = 12345;
        let hits = (0..10_000)
            .filter(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let offset = (x >> 20) % (1 << 30) / 4096 * 4096;
                random.read_ahead(offset..offset + 4096, CAPACITY, RA).is_some()
            })
            .count();
        assert!(hits < 10, "random reads do not read ahead: {hits}");
    }

    #[test]
    fn ra_reads_a_fixed_amount_past_every_read_without_repeating_itself() {
        let p = policies(ReadPolicy::ReadAhead);
        assert_eq!(p.read_ahead(10 * K64..11 * K64, CAPACITY, RA), Some(11 * K64..15 * K64));
        assert_eq!(p.read_ahead(11 * K64..12 * K64, CAPACITY, RA), None, "still more than half a window ahead");
        assert_eq!(p.read_ahead(12 * K64..13 * K64, CAPACITY, RA), None, "exactly half a window ahead");
        assert_eq!(p.read_ahead(13 * K64..14 * K64, CAPACITY, RA), Some(15 * K64..18 * K64));
        assert_eq!(p.read_ahead(CAPACITY - K64..CAPACITY, CAPACITY, RA), None, "nothing past the end");
    }
}
