//! The drives we emulate, with their datasheet figures and where each figure comes from.
//!
//! Sources are named per figure. "Manual" figures were read from the vendor's product manual
//! (through third-party mirrors of the PDF); "memory" figures are from our knowledge of the data
//! sheet and were not re-checked against a copy; "estimate" figures are not on any datasheet we
//! could read and are derived as stated. MB/s are 10^6 bytes per second, as datasheets write them.

use super::geometry::SeekFigures;

const MIB: u64 = 1 << 20;

pub(crate) struct HddProfile {
    pub(crate) model: &'static str,
    pub(crate) rpm: f64,
    pub(crate) read_seek: SeekFigures,
    pub(crate) write_seek: SeekFigures,
    pub(crate) outer_mb_per_s: f64,
    pub(crate) inner_mb_per_s: f64,
    /// Command decoding and setup before the head moves; paid in full at queue depth 1, hidden
    /// behind the previous command when commands are queued.
    pub(crate) command_overhead_us: f64,
    /// Host link: how fast buffer hits and cached writes move.
    pub(crate) interface_mb_per_s: f64,
    /// Dirty data the write-back cache may hold before writes wait for the platter.
    pub(crate) write_cache_bytes: u64,
    /// How far the drive reads on after a read while it has nothing else to do.
    pub(crate) read_ahead_bytes: u64,
    /// Read segments the cache keeps: the stream being read ahead and the latest ones before it,
    /// so that a few interleaved sequential streams each find their data read ahead.
    pub(crate) read_segments: usize,
    /// Commands the drive reorders among (SATA NCQ and SAS drives of this class: 32).
    pub(crate) queue_depth_max: u32,
}

/// Seagate Cheetah 15K.7 SAS, ST3600057SS (600 GB, 3.5-inch, SAS 6 Gb/s).
pub(crate) const HDD_15K: HddProfile = HddProfile {
    model: "Seagate Cheetah 15K.7 ST3600057SS",
    rpm: 15_000.0, // manual 100516226 §4.2.3: average rotational latency 2.0 ms
    // Manual / memory: average 3.4 ms read, 3.9 ms write; track-to-track 0.2 ms read, 0.44 ms
    // write. Full stroke: estimate, the average times the Savvio 10K.4's full-stroke/average
    // ratio (7.81 / 3.8 read, 8.18 / 4.4 write); both drives use 2.5-inch media.
    read_seek: SeekFigures { track_to_track_ms: 0.2, average_ms: 3.4, full_stroke_ms: 7.0 },
    write_seek: SeekFigures { track_to_track_ms: 0.44, average_ms: 3.9, full_stroke_ms: 7.25 },
    outer_mb_per_s: 204.0, // manual §4.2.3: sustainable disk transfer rate 122-204 MB/s
    inner_mb_per_s: 122.0,
    command_overhead_us: 200.0,  // estimate: the Savvio 10K.4 and Constellation.2 manuals' overhead
    interface_mb_per_s: 600.0,   // manual §4.2.3: SAS maximum instantaneous rate 600 MB/s per port
    write_cache_bytes: 16 * MIB, // memory: 16 MB cache
    read_ahead_bytes: 2 * MIB,   // estimate: one segment of the cache
    read_segments: 8,            // estimate: the 16 MB cache in read-ahead-sized segments
    queue_depth_max: 32,
};

/// Seagate Savvio 10K.4 SAS, ST9600204SS (600 GB, 2.5-inch, SAS 6 Gb/s).
pub(crate) const HDD_10K: HddProfile = HddProfile {
    model: "Seagate Savvio 10K.4 ST9600204SS",
    rpm: 10_000.0, // manual 100539221 Rev. A §4.1: 10K rpm, average rotational latency 3.0 ms
    // Manual §4.2.1, "not including controller overhead": average 3.8 / 4.4 ms, single track
    // 0.30 / 0.56 ms, full stroke 7.81 / 8.18 ms (read / write).
    read_seek: SeekFigures { track_to_track_ms: 0.30, average_ms: 3.8, full_stroke_ms: 7.81 },
    write_seek: SeekFigures { track_to_track_ms: 0.56, average_ms: 4.4, full_stroke_ms: 8.18 },
    // Estimate: the manual gives 677,557 bytes per track on average, i.e. 113 MB/s at 6 ms per
    // revolution; spread over the 1.67:1 outer/inner ratio usual for 2.5-inch media.
    outer_mb_per_s: 150.0,
    inner_mb_per_s: 90.0,
    command_overhead_us: 200.0, // manual §4.2.1: average 4.0 ms with overhead, 3.8 ms without
    interface_mb_per_s: 600.0,
    write_cache_bytes: 16 * MIB, // memory: 16 MB cache
    read_ahead_bytes: 2 * MIB,
    read_segments: 8, // estimate, as for the 15K.7
    queue_depth_max: 32,
};

/// Seagate Constellation ES.3 SAS, ST4000NM0023 (4 TB, 3.5-inch, SAS 6 Gb/s); the class of the WD
/// RE4 and other 7,200 rpm enterprise drives.
pub(crate) const HDD_7200: HddProfile = HddProfile {
    model: "Seagate Constellation ES.3 ST4000NM0023",
    rpm: 7_200.0, // manual (ES.3 SAS, Rev. B) §4.1: average rotational latency 4.16 ms
    // Average 8.5 ms read, 9.5 ms write: memory of the ES.3 data sheet. Track-to-track 0.5 / 0.7
    // ms and full stroke 17.35 / 17.82 ms: the Constellation SAS (ST9500430SS) manual §5.2.1, the
    // closest Seagate 7,200 rpm table we could read.
    read_seek: SeekFigures { track_to_track_ms: 0.5, average_ms: 8.5, full_stroke_ms: 17.35 },
    write_seek: SeekFigures { track_to_track_ms: 0.7, average_ms: 9.5, full_stroke_ms: 17.82 },
    outer_mb_per_s: 175.0, // manual §4.1.2: sustained transfer rate 83 to 175 MB/s
    inner_mb_per_s: 83.0,
    command_overhead_us: 200.0,   // Constellation.2 SAS manual §5.2.1: 7.7 ms with, 7.5 without
    interface_mb_per_s: 600.0,    // manual §4.1.2: 600 MB/s per port
    write_cache_bytes: 128 * MIB, // memory: 128 MB cache
    read_ahead_bytes: 2 * MIB,
    read_segments: 8, // estimate, as for the 15K.7
    queue_depth_max: 32,
};

/// One kind of SSD operation at the drive's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SsdFigures {
    /// Queue-depth-1 latency of a 4 KiB operation.
    pub(crate) latency_us: f64,
    /// 4 KiB operations per second at high queue depth.
    pub(crate) iops_4k: f64,
    /// Sequential bandwidth (128 KiB operations).
    pub(crate) mb_per_s: f64,
}

pub(crate) struct SsdProfile {
    pub(crate) model: &'static str,
    pub(crate) read: SsdFigures,
    /// Writes while the drive still has erased blocks to spare.
    pub(crate) write_fresh: SsdFigures,
    /// Writes once garbage collection runs alongside them (datasheets quote this state).
    pub(crate) write_steady: SsdFigures,
    /// Flash channels (or die groups) that work at once.
    pub(crate) parallel_units: usize,
    /// Spare area as a fraction of the capacity: once this much has been written, writes are
    /// in the steady state.
    pub(crate) spare_fraction: f64,
    /// Commands the drive holds at once (SATA NCQ: 32).
    pub(crate) queue_depth_max: u32,
}

/// Intel SSD DC S3700, SSDSC2BA400G3 (400 GB, SATA 6 Gb/s).
pub(crate) const SSD_SATA: SsdProfile = SsdProfile {
    model: "Intel SSD DC S3700 SSDSC2BA400G3",
    // Product specification (memory): 4 KiB random 75k read / 36k write IOPS (steady state),
    // sequential 500 / 460 MB/s, typical latency 50 us read / 65 us write.
    read: SsdFigures { latency_us: 50.0, iops_4k: 75_000.0, mb_per_s: 500.0 },
    // Estimate: fresh-out-of-box random writes about twice the steady state, capped by reads.
    write_fresh: SsdFigures { latency_us: 65.0, iops_4k: 72_000.0, mb_per_s: 460.0 },
    write_steady: SsdFigures { latency_us: 65.0, iops_4k: 36_000.0, mb_per_s: 460.0 },
    parallel_units: 8,    // AnandTech's S3700 review: the controller has 8 NAND channels
    spare_fraction: 0.32, // memory of AnandTech's review: 264 GB of NAND behind 200 GB
    queue_depth_max: 32,
};

/// A 12 Gb/s SAS MLC SSD of the HGST Ultrastar SSD1600MM class (HUSMM1640ASS200, 400 GB).
pub(crate) const SSD_SAS: SsdProfile = SsdProfile {
    model: "HGST Ultrastar SSD1600MM HUSMM1640ASS200",
    // Memory, not re-checked: about 1,100 MB/s read, 765 MB/s write, 130k / 100k 4 KiB IOPS.
    // Latencies are estimates for a SAS stack (longer than SATA for reads; writes land in a
    // power-loss-protected buffer).
    read: SsdFigures { latency_us: 100.0, iops_4k: 130_000.0, mb_per_s: 1_100.0 },
    write_fresh: SsdFigures { latency_us: 40.0, iops_4k: 100_000.0, mb_per_s: 765.0 },
    // Estimate: steady-state random writes at half the quoted figure.
    write_steady: SsdFigures { latency_us: 40.0, iops_4k: 50_000.0, mb_per_s: 765.0 },
    parallel_units: 16,
    spare_fraction: 0.28,
    queue_depth_max: 64,
};

/// Intel SSD DC P3700, SSDPEDMD020T4 (2 TB, NVMe over PCIe 3.0 x4).
pub(crate) const SSD_NVME: SsdProfile = SsdProfile {
    model: "Intel SSD DC P3700 SSDPEDMD020T4",
    // Product specification (memory): 4 KiB random 460k read / 175k write IOPS (steady state),
    // sequential 2,800 / 2,000 MB/s, typical latency 20 us read and write.
    read: SsdFigures { latency_us: 20.0, iops_4k: 460_000.0, mb_per_s: 2_800.0 },
    // Estimate: fresh writes about twice the steady state.
    write_fresh: SsdFigures { latency_us: 20.0, iops_4k: 350_000.0, mb_per_s: 2_000.0 },
    write_steady: SsdFigures { latency_us: 20.0, iops_4k: 175_000.0, mb_per_s: 2_000.0 },
    parallel_units: 18,   // the P3700's controller has 18 NAND channels
    spare_fraction: 0.25, // estimate
    queue_depth_max: 1024,
};
