//! The bytes of the journal device: where each block lives and the codec of its three block
//! kinds. The byte tables are in docs/on-disk-format.md ("Journal ..."), checked against the
//! [`Field`] tables here by `journal::tests::doc_tables_match_the_code`.
//!
//! ```text
//! 0      superblock copy 0 (4 KiB)
//! 4096   superblock copy 1
//! 8192   partition 0: checkpoint block A, checkpoint block B, then its ring of records
//!        partition 1 ...  (one per shard, `partition_bytes` each)
//!        image partition 0, 1 ... (format 3: one per shard, `image_partition_bytes` each)
//! ```
//!
//! A data partition holds the cache's data records; an image partition holds row images: every
//! member write of one parity row write (data pieces, P, Q), logged before the row's member
//! writes, so that replay can put a row torn by a crash back in one piece (the RAID5/6 write
//! hole). Image partitions are separate rings so that destaging, which writes images, never
//! waits for room that only destaging can free.
//!
//! Every block's CRC-32C is seeded with the controller id ([`Seed`]), so that a journal that
//! belongs to another controller never validates, and a record also names its journal id, its
//! sequence number and its own position: a stale record left in the ring from an earlier lap or
//! an earlier format of the device fails one of these checks.

use crate::metadata::{tiles, Field};

/// Every block of the journal is this long and aligned to it.
pub const BLOCK_BYTES: u64 = 4096;
/// Version 2 names each leg of a mirrored pair in the superblock (`leg_index`, `leg_count`);
/// version 1 devices (those bytes zero) are read as the one leg of a single journal.
/// Version 3 adds the image partitions and row image records.
/// Version 4 writes data as group records: the writes one turn of the shard placed, under one
/// header (kind 1 records are still replayed).
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format replay still reads.
pub const FORMAT_VERSION_OLDEST: u32 = 1;
/// Legs a journal has at most: one, or a mirrored pair.
pub const LEGS_MAX: usize = 2;
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"STORCJSB";
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"STORCJCP";
pub const RECORD_MAGIC: [u8; 8] = *b"STORCJRC";
/// The two superblock copies, then the partitions.
pub const PARTITIONS_OFFSET_BYTES: u64 = 2 * BLOCK_BYTES;
/// A partition's two checkpoint blocks, then its ring.
pub const RING_OFFSET_IN_PARTITION_BYTES: u64 = 2 * BLOCK_BYTES;
/// Data one record carries at most: its header holds a CRC per 4 KiB page of it.
pub const RECORD_DATA_BYTES_MAX: u64 = 1 << 20;
/// CRCs a record header holds.
pub const PAGE_CRCS_MAX: usize = (RECORD_DATA_BYTES_MAX / BLOCK_BYTES) as usize;

/// A record carrying data for a VD range.
pub const KIND_DATA: u32 = 1;
/// A record that only says "the ring continues at its start": what fills the end of the ring
/// when the next record does not fit there.
pub const KIND_WRAP: u32 = 2;
/// A row image: the member writes of one parity row write (format 3, image partitions only).
pub const KIND_IMAGE: u32 = 3;
/// A group record: the data of several VD writes, each named by an entry (format 4, data
/// partitions only). One header and one device write carry every write a shard placed while
/// the journal was busy, where a record per write cost a 4 KiB header and a write each.
pub const KIND_GROUP: u32 = 4;
/// Entries one image or group record names at most.
pub const IMAGE_ENTRIES_MAX: usize = 187;
/// Bytes of one entry: member (or VD id), length, member (or VD) offset.
pub const IMAGE_ENTRY_BYTES: usize = 16;

pub(crate) mod superblock {
    use super::Field;
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const PARTITION_COUNT: Field = Field::new("partition_count", 12, 4);
    pub const CONTROLLER_ID: Field = Field::new("controller_id", 16, 16);
    pub const JOURNAL_ID: Field = Field::new("journal_id", 32, 8);
    pub const CAPACITY_BYTES: Field = Field::new("capacity_bytes", 40, 8);
    pub const PARTITION_BYTES: Field = Field::new("partition_bytes", 48, 8);
    pub const GENERATION: Field = Field::new("generation", 56, 8);
    pub const WRITTEN_UNIX_NS: Field = Field::new("written_unix_ns", 64, 8);
    /// Version 2: which leg of the journal this device is, and how many it has.
    pub const LEG_INDEX: Field = Field::new("leg_index", 72, 4);
    pub const LEG_COUNT: Field = Field::new("leg_count", 76, 4);
    /// Version 3: the size of each image partition (0: none).
    pub const IMAGE_PARTITION_BYTES: Field = Field::new("image_partition_bytes", 80, 8);
    pub const RESERVED: Field = Field::new("reserved", 88, 4004);
    pub const CRC32C: Field = Field::new("block_crc32c", 4092, 4);
    pub const ALL: [Field; 14] = [
        MAGIC,
        VERSION,
        PARTITION_COUNT,
        CONTROLLER_ID,
        JOURNAL_ID,
        CAPACITY_BYTES,
        PARTITION_BYTES,
        GENERATION,
        WRITTEN_UNIX_NS,
        LEG_INDEX,
        LEG_COUNT,
        IMAGE_PARTITION_BYTES,
        RESERVED,
        CRC32C,
    ];
}

pub(crate) mod checkpoint {
    use super::Field;
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const PARTITION_INDEX: Field = Field::new("partition_index", 12, 4);
    pub const JOURNAL_ID: Field = Field::new("journal_id", 16, 8);
    pub const SUPERBLOCK_GENERATION: Field = Field::new("superblock_generation", 24, 8);
    pub const COUNTER: Field = Field::new("counter", 32, 8);
    pub const TAIL_POSITION_BYTES: Field = Field::new("tail_position_bytes", 40, 8);
    pub const TAIL_SEQUENCE: Field = Field::new("tail_sequence", 48, 8);
    pub const RESERVED: Field = Field::new("reserved", 56, 4036);
    pub const CRC32C: Field = Field::new("block_crc32c", 4092, 4);
    pub const ALL: [Field; 10] =
        [MAGIC, VERSION, PARTITION_INDEX, JOURNAL_ID, SUPERBLOCK_GENERATION, COUNTER, TAIL_POSITION_BYTES, TAIL_SEQUENCE, RESERVED, CRC32C];
}

pub(crate) mod record {
    use super::Field;
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const KIND: Field = Field::new("kind", 12, 4);
    pub const JOURNAL_ID: Field = Field::new("journal_id", 16, 8);
    pub const SEQUENCE: Field = Field::new("sequence", 24, 8);
    pub const POSITION_BYTES: Field = Field::new("position_bytes", 32, 8);
    pub const RECORD_BYTES: Field = Field::new("record_bytes", 40, 4);
    pub const VD_ID: Field = Field::new("vd_id", 44, 4);
    pub const VD_OFFSET_BYTES: Field = Field::new("vd_offset_bytes", 48, 8);
    pub const DATA_BYTES: Field = Field::new("data_bytes", 56, 4);
    pub const PAGE_COUNT: Field = Field::new("page_count", 60, 4);
    pub const PAGE_CRC32C: Field = Field::new("page_crc32c", 64, 1024);
    /// Version 3, image records: how many member writes `entries` names; version 4, group
    /// records: how many VD writes.
    pub const ENTRY_COUNT: Field = Field::new("entry_count", 1088, 4);
    /// Version 3, image records: per member write, its member (u32), length (u32) and member
    /// offset (u64); version 4, group records: per VD write, its VD id (u32), length (u32) and
    /// VD offset (u64). The data is their bytes one after the other.
    pub const ENTRIES: Field = Field::new("entries", 1092, 2992);
    pub const RESERVED: Field = Field::new("reserved", 4084, 8);
    pub const CRC32C: Field = Field::new("block_crc32c", 4092, 4);
    pub const ALL: [Field; 16] = [
        MAGIC,
        VERSION,
        KIND,
        JOURNAL_ID,
        SEQUENCE,
        POSITION_BYTES,
        RECORD_BYTES,
        VD_ID,
        VD_OFFSET_BYTES,
        DATA_BYTES,
        PAGE_COUNT,
        PAGE_CRC32C,
        ENTRY_COUNT,
        ENTRIES,
        RESERVED,
        CRC32C,
    ];
}

const _: () = assert!(tiles(&superblock::ALL, BLOCK_BYTES as usize));
const _: () = assert!(tiles(&checkpoint::ALL, BLOCK_BYTES as usize));
const _: () = assert!(tiles(&record::ALL, BLOCK_BYTES as usize));
const _: () = assert!(record::PAGE_CRC32C.size == PAGE_CRCS_MAX * 4);
const _: () = assert!(record::ENTRIES.size == IMAGE_ENTRIES_MAX * IMAGE_ENTRY_BYTES);

/// The CRC-32C seed of every block: the controller id's own CRC, so that the journal of another
/// controller (or of a reformatted one) never validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seed(u32);

impl Seed {
    pub fn of_controller(controller_id: u128) -> Seed {
        Seed(crc32c::crc32c(&controller_id.to_le_bytes()))
    }

    pub fn crc(self, bytes: &[u8]) -> u32 {
        crc32c::crc32c_append(self.0, bytes)
    }
}

/// What the superblock says: the device's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub controller_id: u128,
    pub journal_id: u64,
    pub capacity_bytes: u64,
    pub partition_count: u32,
    pub partition_bytes: u64,
    /// Incremented on every rewrite (a new layout after replay); checkpoints name theirs.
    pub generation: u64,
    /// Which leg of a mirrored pair this device is (0 for a single journal), and how many legs
    /// the journal was laid out with: every leg holds the same blocks but these.
    pub leg_index: u32,
    pub leg_count: u32,
    /// Each image partition's size (0: none: format 1 and 2 devices, and journals too small).
    pub image_partition_bytes: u64,
}

/// The smallest partition: its checkpoints and the smallest ring.
pub const PARTITION_BYTES_MIN: u64 = RING_OFFSET_IN_PARTITION_BYTES + RING_BYTES_MIN;

impl Superblock {
    /// The layout of a device of `capacity_bytes` cut into `partition_count` partitions, or why
    /// it cannot be (too small for a ring that holds its largest record twice over).
    ///
    /// Each shard's share is cut into a data partition and an image partition of an eighth of
    /// it (at least the smallest partition); a share too small for both gets no image
    /// partition, and parity writes then go unlogged (the bitmap says so).
    pub fn plan(controller_id: u128, journal_id: u64, capacity_bytes: u64, partition_count: u32) -> Result<Superblock, String> {
        assert!(partition_count > 0, "a journal has a partition per shard");
        let usable = capacity_bytes.saturating_sub(PARTITIONS_OFFSET_BYTES);
        let share_bytes = usable / u64::from(partition_count) / BLOCK_BYTES * BLOCK_BYTES;
        let image_partition_bytes = match share_bytes >= 2 * PARTITION_BYTES_MIN {
            true => (share_bytes / 8 / BLOCK_BYTES * BLOCK_BYTES).max(PARTITION_BYTES_MIN),
            false => 0,
        };
        let partition_bytes = share_bytes - image_partition_bytes;
        if partition_bytes < PARTITION_BYTES_MIN {
            let needed = PARTITIONS_OFFSET_BYTES + u64::from(partition_count) * PARTITION_BYTES_MIN;
            return Err(format!(
                "a journal of {capacity_bytes} bytes is too small for {partition_count} shards: at least {needed} bytes ({} MiB) are needed",
                needed.div_ceil(1 << 20)
            ));
        }
        Ok(Superblock {
            controller_id,
            journal_id,
            capacity_bytes,
            partition_count,
            partition_bytes,
            generation: 1,
            leg_index: 0,
            leg_count: 1,
            image_partition_bytes,
        })
    }

    /// Partitions on the device: the data partitions `0..partition_count`, then (if any) the
    /// image partitions, image partition `i` being partition `partition_count + i`.
    pub fn all_partition_count(&self) -> u32 {
        if self.image_partition_bytes == 0 {
            self.partition_count
        } else {
            2 * self.partition_count
        }
    }

    /// The image partition of shard `shard`, if the layout has them.
    pub fn image_partition(&self, shard: u32) -> Option<u32> {
        (self.image_partition_bytes > 0 && shard < self.partition_count).then(|| self.partition_count + shard)
    }

    /// Where partition `index` starts on the device.
    pub fn partition_offset_bytes(&self, index: u32) -> u64 {
        assert!(index < self.all_partition_count(), "partition {index} of {}", self.all_partition_count());
        let data_bytes = u64::from(index.min(self.partition_count)) * self.partition_bytes;
        let image_bytes = u64::from(index.saturating_sub(self.partition_count)) * self.image_partition_bytes;
        PARTITIONS_OFFSET_BYTES + data_bytes + image_bytes
    }

    /// How long partition `index` is.
    pub fn partition_size_bytes(&self, index: u32) -> u64 {
        if index < self.partition_count {
            self.partition_bytes
        } else {
            self.image_partition_bytes
        }
    }

    pub fn encode(&self, seed: Seed, written_unix_ns: u64) -> Vec<u8> {
        use superblock as f;
        let mut bytes = vec![0u8; BLOCK_BYTES as usize];
        put(&mut bytes, f::MAGIC, &SUPERBLOCK_MAGIC);
        put(&mut bytes, f::VERSION, &FORMAT_VERSION.to_le_bytes());
        put(&mut bytes, f::PARTITION_COUNT, &self.partition_count.to_le_bytes());
        put(&mut bytes, f::CONTROLLER_ID, &self.controller_id.to_le_bytes());
        put(&mut bytes, f::JOURNAL_ID, &self.journal_id.to_le_bytes());
        put(&mut bytes, f::CAPACITY_BYTES, &self.capacity_bytes.to_le_bytes());
        put(&mut bytes, f::PARTITION_BYTES, &self.partition_bytes.to_le_bytes());
        put(&mut bytes, f::GENERATION, &self.generation.to_le_bytes());
        put(&mut bytes, f::WRITTEN_UNIX_NS, &written_unix_ns.to_le_bytes());
        put(&mut bytes, f::LEG_INDEX, &self.leg_index.to_le_bytes());
        put(&mut bytes, f::LEG_COUNT, &self.leg_count.to_le_bytes());
        put(&mut bytes, f::IMAGE_PARTITION_BYTES, &self.image_partition_bytes.to_le_bytes());
        seal(&mut bytes, seed, f::CRC32C);
        bytes
    }

    /// The superblock in `bytes`, or why there is none.
    pub fn decode(bytes: &[u8], seed: Seed) -> Result<Superblock, String> {
        use superblock as f;
        check_block(bytes, seed, SUPERBLOCK_MAGIC, f::VERSION, f::CRC32C, f::RESERVED, "journal superblock")?;
        let sb = Superblock {
            controller_id: u128::from_le_bytes(get(bytes, f::CONTROLLER_ID)),
            journal_id: get_u64(bytes, f::JOURNAL_ID),
            capacity_bytes: get_u64(bytes, f::CAPACITY_BYTES),
            partition_count: get_u32(bytes, f::PARTITION_COUNT),
            partition_bytes: get_u64(bytes, f::PARTITION_BYTES),
            generation: get_u64(bytes, f::GENERATION),
            leg_index: get_u32(bytes, f::LEG_INDEX),
            // Version 1 kept these bytes zero: one leg.
            leg_count: get_u32(bytes, f::LEG_COUNT).max(1),
            // Versions 1 and 2 kept these bytes zero: no image partitions.
            image_partition_bytes: get_u64(bytes, f::IMAGE_PARTITION_BYTES),
        };
        let images_fit = sb.image_partition_bytes == 0
            || (sb.image_partition_bytes.is_multiple_of(BLOCK_BYTES) && sb.image_partition_bytes >= PARTITION_BYTES_MIN);
        let fits = sb.leg_index < sb.leg_count
            && sb.leg_count as usize <= LEGS_MAX
            && sb.partition_count > 0
            && sb.partition_bytes.is_multiple_of(BLOCK_BYTES)
            && sb.partition_bytes >= PARTITION_BYTES_MIN
            && images_fit
            && sb
                .partition_bytes
                .checked_add(sb.image_partition_bytes)
                .and_then(|share| share.checked_mul(u64::from(sb.partition_count)))
                .and_then(|b| b.checked_add(PARTITIONS_OFFSET_BYTES))
                .is_some_and(|end| end <= sb.capacity_bytes);
        if !fits {
            return Err(format!(
                "journal superblock describes {} partitions of {} bytes that do not fit its {} bytes, or leg {} of {}",
                sb.partition_count, sb.partition_bytes, sb.capacity_bytes, sb.leg_index, sb.leg_count
            ));
        }
        Ok(sb)
    }
}

/// The smallest ring: room for the largest record and its wrap block, twice.
pub const RING_BYTES_MIN: u64 = 2 * (RECORD_DATA_BYTES_MAX + 2 * BLOCK_BYTES);

/// What a checkpoint block says: where a partition's replay starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub partition_index: u32,
    pub journal_id: u64,
    pub superblock_generation: u64,
    /// Incremented on every write; the valid block with the larger counter wins.
    pub counter: u64,
    /// The oldest record that may not be on the members yet (or where the next record goes).
    pub tail_position_bytes: u64,
    /// The sequence number the record at the tail must carry.
    pub tail_sequence: u64,
}

impl Checkpoint {
    /// Which of the partition's two blocks this checkpoint is written to: they alternate, so a
    /// torn write leaves the previous one.
    pub fn block_index(&self) -> u64 {
        self.counter % 2
    }

    pub fn encode(&self, seed: Seed) -> Vec<u8> {
        use checkpoint as f;
        let mut bytes = vec![0u8; BLOCK_BYTES as usize];
        put(&mut bytes, f::MAGIC, &CHECKPOINT_MAGIC);
        put(&mut bytes, f::VERSION, &FORMAT_VERSION.to_le_bytes());
        put(&mut bytes, f::PARTITION_INDEX, &self.partition_index.to_le_bytes());
        put(&mut bytes, f::JOURNAL_ID, &self.journal_id.to_le_bytes());
        put(&mut bytes, f::SUPERBLOCK_GENERATION, &self.superblock_generation.to_le_bytes());
        put(&mut bytes, f::COUNTER, &self.counter.to_le_bytes());
        put(&mut bytes, f::TAIL_POSITION_BYTES, &self.tail_position_bytes.to_le_bytes());
        put(&mut bytes, f::TAIL_SEQUENCE, &self.tail_sequence.to_le_bytes());
        seal(&mut bytes, seed, f::CRC32C);
        bytes
    }

    pub fn decode(bytes: &[u8], seed: Seed) -> Result<Checkpoint, String> {
        use checkpoint as f;
        check_block(bytes, seed, CHECKPOINT_MAGIC, f::VERSION, f::CRC32C, f::RESERVED, "journal checkpoint")?;
        Ok(Checkpoint {
            partition_index: get_u32(bytes, f::PARTITION_INDEX),
            journal_id: get_u64(bytes, f::JOURNAL_ID),
            superblock_generation: get_u64(bytes, f::SUPERBLOCK_GENERATION),
            counter: get_u64(bytes, f::COUNTER),
            tail_position_bytes: get_u64(bytes, f::TAIL_POSITION_BYTES),
            tail_sequence: get_u64(bytes, f::TAIL_SEQUENCE),
        })
    }
}

/// A data record's length on the device: its header and its data in whole blocks.
pub fn record_bytes_for(data_bytes: u64) -> u64 {
    BLOCK_BYTES + data_bytes.next_multiple_of(BLOCK_BYTES)
}

/// The seeded CRC of each 4 KiB page of `data`, the last one zero-padded.
fn page_crcs(seed: Seed, data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK_BYTES as usize)
        .map(|page| {
            let pad = BLOCK_BYTES as usize - page.len();
            let crc = seed.crc(page);
            if pad == 0 {
                crc
            } else {
                crc32c::crc32c_append(crc, &vec![0u8; pad])
            }
        })
        .collect()
}

mod record_header;
pub use record_header::{GroupEntry, ImageEntry, RecordHeader};

fn put(out: &mut [u8], field: Field, bytes: &[u8]) {
    assert_eq!(bytes.len(), field.size, "field `{}` is {} bytes", field.name, field.size);
    out[field.range()].copy_from_slice(bytes);
}

fn get<const N: usize>(bytes: &[u8], field: Field) -> [u8; N] {
    assert_eq!(N, field.size, "field `{}` is {} bytes", field.name, field.size);
    bytes[field.range()].try_into().expect("field size checked")
}

fn get_u32(bytes: &[u8], field: Field) -> u32 {
    u32::from_le_bytes(get(bytes, field))
}

fn get_u64(bytes: &[u8], field: Field) -> u64 {
    u64::from_le_bytes(get(bytes, field))
}

/// Writes the block's seeded CRC over everything before the CRC field.
fn seal(bytes: &mut [u8], seed: Seed, crc_field: Field) {
    let crc = seed.crc(&bytes[..crc_field.offset]);
    put(bytes, crc_field, &crc.to_le_bytes());
}

/// The checks every block kind shares: length, magic, seeded CRC, version, reserved bytes zero.
fn check_block(
    bytes: &[u8],
    seed: Seed,
    magic: [u8; 8],
    version: Field,
    crc_field: Field,
    reserved: Field,
    what: &str,
) -> Result<(), String> {
    if bytes.len() < BLOCK_BYTES as usize || bytes[..8] != magic {
        return Err(format!("no {what} here"));
    }
    if seed.crc(&bytes[..crc_field.offset]) != get_u32(bytes, crc_field) {
        return Err(format!("{what} checksum mismatch (torn, corrupted or another controller's)"));
    }
    if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&get_u32(bytes, version)) {
        return Err(format!(
            "{what} format version {} is unknown (this storc reads {FORMAT_VERSION_OLDEST} to {FORMAT_VERSION})",
            get_u32(bytes, version)
        ));
    }
    if bytes[reserved.range()].iter().any(|&b| b != 0) {
        return Err(format!("{what} has reserved bytes set"));
    }
    Ok(())
}
