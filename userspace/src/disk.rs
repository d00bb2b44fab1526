// SPDX-License-Identifier: GPL-2.0-only
//! The cache device's on-disk metadata, read and written with the module's
//! own C code: dm-tiercache/tc_disk.c is compiled into the tool (build.rs)
//! and its structures and constants come from tc_disk.h through bindgen.
//! Nothing here decodes a field itself; this module only moves bytes to and
//! from devices and calls `tc_sb_decode`, `tc_de_decode` and friends.
//!
//! Also here: `Dev`, a block device or regular file opened for metadata
//! and data access (O_DIRECT on block devices, so that what the module
//! wrote through bios is read, not a stale page cache), `survey`, the
//! walk over every entry that `check`, `writeback` and `--format` use, and
//! `read_summary`, the summary of a version 4 cache, which `check` holds
//! against the entries.

use serde::Serialize;
use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};

use crate::error::{busy, Error, Kind, Result};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/tc_disk.rs"));
}

/// Bytes of the superblock structure (one sector).
pub const SB_BYTES: usize = std::mem::size_of::<ffi::tc_disk_sb>();
/// Bytes of one entry.
pub const ENTRY_BYTES: usize = std::mem::size_of::<ffi::tc_disk_entry>();
/// Bytes of one metadata block.
pub const MBLOCK_BYTES: usize = ffi::TC_MBLOCK_BYTES as usize;
/// Sectors reserved for the superblock at the start of the device.
pub const SB_SECTORS: u64 = ffi::TC_SB_SECTORS as u64;
/// The format version a format writes: 4, version 3's format with a
/// summary (the tool also reads versions 3, 2 and 1: 2 and 1 of epoch 0,
/// and version 1 as format generation 0).
pub const VERSION: u32 = ffi::TC_DISK_VERSION;
/// The last version without a summary: a cache formatted before version 4
/// keeps its layout, and is written as version 3.
pub const VERSION_V3: u32 = ffi::TC_DISK_VERSION_V3;
/// The last version without epochs.
pub const VERSION_V2: u32 = ffi::TC_DISK_VERSION_V2;
/// Superblock flag: the cache device failed (tc_disk.h, TC_SB_FAILED).
pub const SB_FAILED: u32 = ffi::TC_SB_FAILED;

/// Entries in one metadata block (TC_ENTRIES_PER_MBLOCK, from C).
pub fn entries_per_mblock() -> u64 {
    ffi::tc_abi_entries_per_mblock
}

/// The magic string, without the C string's NUL.
pub fn magic() -> &'static str {
    std::str::from_utf8(&ffi::TC_DISK_MAGIC[..ffi::TC_DISK_MAGIC.len() - 1]).unwrap()
}

/// The absolute epoch of an entry's 16 epoch bits `e` under a superblock
/// of epoch `sb_epoch` (`tc_disk_epoch`): the first epoch from `sb_epoch`
/// on with those low bits.
pub fn disk_epoch(sb_epoch: u64, e: u16) -> u64 {
    // SAFETY: plain values in and out.
    unsafe { ffi::tc_abi_disk_epoch(sb_epoch, e) }
}

/// CRC-32C as the format uses it (tests craft checksummed values with it).
#[cfg(test)]
pub fn crc(data: &[u8]) -> u32 {
    // SAFETY: pointer and length of a live slice.
    unsafe { ffi::tc_disk_crc(data.as_ptr().cast(), data.len()) }
}

fn c_str(p: *const std::os::raw::c_char) -> &'static str {
    if p.is_null() {
        return "unknown";
    }
    // SAFETY: tc_*_result_str return pointers to static C strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("unknown")
}

// --------------------------------------------------------------------
// Layout and superblock
// --------------------------------------------------------------------

/// Where things are on the cache device, in 512-byte sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub block_sectors: u32,
    pub nr_slots: u64,
    pub meta_start: u64,
    /// 4 KiB metadata blocks holding the entries.
    pub meta_blocks: u64,
    /// Version 4: the first sector of the summary, right after the
    /// entries; 0 before.
    pub sum_start: u64,
    /// 4 KiB summary blocks (`SUM_BITS` metadata blocks to each); 0: no
    /// summary (versions 1 to 3).
    pub sum_blocks: u64,
    /// Slot 0: after the entries, and the summary if there is one.
    pub data_start: u64,
}

impl Layout {
    fn from_c(l: &ffi::tc_layout) -> Layout {
        Layout {
            block_sectors: l.block_sectors,
            nr_slots: l.nr_slots,
            meta_start: l.meta_start,
            meta_blocks: l.meta_blocks,
            sum_start: l.sum_start,
            sum_blocks: l.sum_blocks,
            data_start: l.data_start,
        }
    }
    fn to_c(self) -> ffi::tc_layout {
        ffi::tc_layout {
            block_sectors: self.block_sectors,
            nr_slots: self.nr_slots,
            meta_start: self.meta_start,
            meta_blocks: self.meta_blocks,
            sum_start: self.sum_start,
            sum_blocks: self.sum_blocks,
            data_start: self.data_start,
        }
    }
    /// The format version a superblock of this layout is written in
    /// (`tc_disk_layout_version`): 4 with a summary, else 3.
    pub fn version(&self) -> u32 {
        // SAFETY: a live struct in, a plain value out.
        unsafe { ffi::tc_disk_layout_version(&self.to_c()) }
    }
    /// The sector after the last slot.
    pub fn end_sector(&self) -> u64 {
        self.data_start
            .saturating_add(self.nr_slots.saturating_mul(self.block_sectors as u64))
    }
    /// The sector after the last metadata block.
    pub fn meta_end_sector(&self) -> u64 {
        self.meta_start
            .saturating_add(self.meta_blocks.saturating_mul(MBLOCK_BYTES as u64 / 512))
    }
    /// The sector after the last summary block (no summary: 0).
    pub fn sum_end_sector(&self) -> u64 {
        self.sum_start
            .saturating_add(self.sum_blocks.saturating_mul(MBLOCK_BYTES as u64 / 512))
    }
    /// Is there a summary (format version 4)?
    pub fn has_summary(&self) -> bool {
        self.sum_blocks > 0
    }
    /// Byte offset of a slot's data.
    pub fn slot_offset(&self, slot: u64) -> u64 {
        (self.data_start + slot * self.block_sectors as u64) * 512
    }
    pub fn block_bytes(&self) -> u64 {
        self.block_sectors as u64 * 512
    }
}

/// The layout a format gives a device of `cache_sectors` (`tc_disk_layout`:
/// the current version's, with a summary): the most slots it holds, `None`
/// if the block size is invalid or not one slot fits.  For a new format
/// only: an existing cache is compared with `layout_v` of its version.
pub fn layout(cache_sectors: u64, block_sectors: u32) -> Option<Layout> {
    let mut l = ffi::tc_layout::default();
    // SAFETY: l is a valid out-parameter.
    let r = unsafe { ffi::tc_disk_layout(cache_sectors, block_sectors, &mut l) };
    (r == 0).then(|| Layout::from_c(&l))
}

/// The layout of format `version` on a device of `cache_sectors`
/// (`tc_disk_layout_v`): versions 1 to 3 have no summary, so hold a slot
/// more on some devices than version 4.  What a cache formatted in that
/// version on this device would be: the geometry to compare an existing
/// superblock of that version with.
pub fn layout_v(cache_sectors: u64, block_sectors: u32, version: u32) -> Option<Layout> {
    let mut l = ffi::tc_layout::default();
    // SAFETY: l is a valid out-parameter.
    let r = unsafe { ffi::tc_disk_layout_v(cache_sectors, block_sectors, version, &mut l) };
    (r == 0).then(|| Layout::from_c(&l))
}

/// What `tc_sb_decode` says about a superblock sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SbState {
    Ok,
    Blank,
    BadCsum,
    BadVersion,
    BadFields,
}

impl SbState {
    fn from_c(r: ffi::tc_sb_result) -> SbState {
        match r {
            ffi::tc_sb_result::TC_SB_OK => SbState::Ok,
            ffi::tc_sb_result::TC_SB_BLANK => SbState::Blank,
            ffi::tc_sb_result::TC_SB_BAD_CSUM => SbState::BadCsum,
            ffi::tc_sb_result::TC_SB_BAD_VERSION => SbState::BadVersion,
            _ => SbState::BadFields,
        }
    }
    fn to_c(self) -> ffi::tc_sb_result {
        match self {
            SbState::Ok => ffi::tc_sb_result::TC_SB_OK,
            SbState::Blank => ffi::tc_sb_result::TC_SB_BLANK,
            SbState::BadCsum => ffi::tc_sb_result::TC_SB_BAD_CSUM,
            SbState::BadVersion => ffi::tc_sb_result::TC_SB_BAD_VERSION,
            SbState::BadFields => ffi::tc_sb_result::TC_SB_BAD_FIELDS,
        }
    }
    /// The C code's description (`tc_sb_result_str`).
    pub fn describe(self) -> &'static str {
        // SAFETY: plain value in, static string out.
        c_str(unsafe { ffi::tc_sb_result_str(self.to_c()) })
    }
}

/// A decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Superblock {
    pub layout: Layout,
    pub commit_seq: u64,
    pub origin_sectors: u64,
    /// The dm uuid of the device the cache belongs to; empty: any.
    pub uuid: String,
    /// The format version read (1 to 4; a format writes 4, and a cache
    /// of an earlier version is written as 3, keeping its layout).
    pub version: u32,
    /// The format generation: only entries of this generation (naming
    /// their own slot) are this cache's; version 1 reads as 0.
    pub generation: u32,
    /// `SB_FAILED` or 0 (the decoder refuses other bits).
    pub flags: u32,
    /// A lower bound of the epochs of the committed dirty entries (the
    /// oldest epoch live when the module's last commit began); entries
    /// are never older.  Versions 1 and 2: 0.
    pub epoch: u64,
}

impl Superblock {
    /// Marked failed: by the module when a metadata commit failed, or by
    /// `detach --abandon` (`check --mark-failed`) when an administrator
    /// gave the cache up.  The module
    /// does not load it again; the origin may hold newer data than its
    /// dirty blocks.
    pub fn failed(&self) -> bool {
        self.flags & SB_FAILED != 0
    }
    /// Whole origin blocks: entries must name a block below this.
    pub fn origin_blocks(&self) -> u64 {
        self.origin_sectors / self.layout.block_sectors as u64
    }
    /// Does this format record epochs (version 3 and later)?
    pub fn has_epochs(&self) -> bool {
        self.version > VERSION_V2
    }
    /// Does this cache have a summary (version 4)?  The decoder gives the
    /// layout of the version read, so its summary blocks say.
    pub fn has_summary(&self) -> bool {
        self.layout.has_summary()
    }
}

fn sb_from_bytes(raw: &[u8]) -> ffi::tc_disk_sb {
    let mut sb = ffi::tc_disk_sb::default();
    let n = raw.len().min(SB_BYTES);
    // SAFETY: sb is a plain-old-data struct of SB_BYTES bytes; copy at most
    // that many bytes into it (the rest stays zero).
    unsafe {
        std::ptr::copy_nonoverlapping(raw.as_ptr(), (&mut sb as *mut ffi::tc_disk_sb).cast(), n)
    };
    sb
}

/// Decode the first sector of a cache device.  A buffer shorter than a
/// sector is read as if padded with zeros.
pub fn decode_sb(raw: &[u8]) -> (SbState, Option<Superblock>) {
    let sb = sb_from_bytes(raw);
    let mut i = ffi::tc_sb_info::default();
    // SAFETY: both pointers are to live, properly aligned structs.
    let r = SbState::from_c(unsafe { ffi::tc_sb_decode(&sb, &mut i) });
    if r != SbState::Ok {
        return (r, None);
    }
    let uuid: Vec<u8> = i
        .uuid
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    (
        r,
        Some(Superblock {
            layout: Layout::from_c(&i.layout),
            commit_seq: i.commit_seq,
            origin_sectors: i.origin_sectors,
            uuid: String::from_utf8_lossy(&uuid).into_owned(),
            version: i.version,
            generation: i.gen_,
            flags: i.flags,
            epoch: i.epoch,
        }),
    )
}

fn sb_bytes(sb: &ffi::tc_disk_sb) -> [u8; SB_BYTES] {
    let mut out = [0u8; SB_BYTES];
    // SAFETY: sb is SB_BYTES bytes of plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (sb as *const ffi::tc_disk_sb).cast::<u8>(),
            out.as_mut_ptr(),
            SB_BYTES,
        )
    };
    out
}

/// The superblock area `area` (the first `SB_SECTORS` of a cache device)
/// with its superblock marked failed (`TC_SB_FAILED`): decoded with
/// `tc_sb_decode`, the flag added, encoded again with `tc_sb_encode`,
/// which recomputes the checksum.  The rest of the area is kept.
/// `tc_sb_encode` writes the version of the layout (`Layout::version`):
/// a version 4 superblock stays version 4, a version 3 one version 3 (it
/// has no room for a summary), and a version 1 or 2 superblock becomes one
/// of version 3 and epoch 0 (version 1: generation 0), as the module's
/// first commit makes it.  `None`: marked already, nothing to write.
/// Refused if the superblock does not decode (`dev` names the device).
pub fn sb_marked_failed(area: &[u8], dev: &str) -> Result<Option<Vec<u8>>> {
    let mut sb = sb_from_bytes(area);
    let mut i = ffi::tc_sb_info::default();
    // SAFETY: both pointers are to live, properly aligned structs.
    let st = SbState::from_c(unsafe { ffi::tc_sb_decode(&sb, &mut i) });
    if st != SbState::Ok {
        let kind = if st == SbState::Blank {
            Kind::NoSuperblock
        } else {
            Kind::BadSuperblock
        };
        return Err(Error::new(kind, format!("{dev}: {}", st.describe())));
    }
    if i.flags & SB_FAILED != 0 {
        return Ok(None);
    }
    i.flags |= SB_FAILED;
    // SAFETY: both pointers are to live, properly aligned structs.
    unsafe { ffi::tc_sb_encode(&mut sb, &i) };
    let mut out = area.to_vec();
    out[..SB_BYTES].copy_from_slice(&sb_bytes(&sb));
    Ok(Some(out))
}

/// What the superblock to be marked failed must be: the cache of which
/// device.  `None`: not checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkWant {
    /// The device number of the cache device (fstat of the open node).
    pub devno: Option<(u32, u32)>,
    /// The dm uuid of the device it caches: the superblock's must be the
    /// same, or empty (the module's rule: an empty uuid on either side
    /// matches any).
    pub uuid: Option<String>,
    /// The length of that device (the target length, in sectors): the
    /// superblock's `origin_sectors` must be the same.
    pub origin_sectors: Option<u64>,
}

/// Mark the superblock of `dev` failed (`sb_marked_failed`), if it is the
/// cache `want` says: read its superblock area, write it back marked,
/// sync, and read it back to check.  Returns false if it was marked
/// already (nothing written).  Refused, nothing written: another device
/// number than `want.devno` (exit 3), a blank superblock (11), one that
/// does not decode (12), the cache of another device (4).
pub fn mark_failed(dev: &dyn WriteAt, want: &MarkWant) -> Result<bool> {
    let path = dev.name().to_string();
    if let Some(d) = want.devno {
        if dev.devno() != Some(d) {
            return Err(Error::new(
                Kind::NotFound,
                format!(
                    "{path}: not the cache device: it is {}, the cache device was {}:{}; not marked",
                    match dev.devno() {
                        Some(x) => format!("device {}:{}", x.0, x.1),
                        None => "not a block device".to_string(),
                    },
                    d.0,
                    d.1
                ),
            ));
        }
    }
    let n = (SB_SECTORS * 512) as usize;
    let area = dev.read_at(0, n)?;
    let (st, sb) = decode_sb(&area);
    if let Some(sb) = sb.as_ref().filter(|_| st == SbState::Ok) {
        let mut other = vec![];
        if let Some(u) = want.uuid.as_deref() {
            if !u.is_empty() && !sb.uuid.is_empty() && sb.uuid != u {
                other.push(format!("uuid {}, not {u}", sb.uuid));
            }
        }
        if let Some(o) = want.origin_sectors {
            if sb.origin_sectors != o {
                other.push(format!(
                    "an origin of {} sectors, not {o}",
                    sb.origin_sectors
                ));
            }
        }
        if !other.is_empty() {
            return Err(busy(format!(
                "{path}: its superblock is the cache of another device ({}); not marked",
                other.join(", ")
            )));
        }
    }
    let Some(new) = sb_marked_failed(&area, &path)? else {
        return Ok(false);
    };
    dev.write_at(0, &new)?;
    dev.sync()?;
    let (st, sb) = decode_sb(&dev.read_at(0, SB_BYTES)?);
    if st != SbState::Ok || !sb.is_some_and(|sb| sb.failed()) {
        return Err(Error::new(
            Kind::Unreadable,
            format!(
                "{path}: the superblock does not read back marked failed ({})",
                st.describe()
            ),
        ));
    }
    Ok(true)
}

/// Encode a superblock (`tc_sb_encode`, which writes the version of its
/// layout: 4 with a summary, else 3).  The uuid is cut at 128 bytes.
/// Another `version` (1 or 2, with a layout of `layout_v` of it) gives what
/// the code of that version wrote: the version field and checksum are
/// redone (the epoch must be 0, and in version 1 the generation).  The
/// tool writes no superblock but to mark one failed (`sb_marked_failed`,
/// through the C code): for tests.
#[cfg(test)]
pub fn encode_sb(s: &Superblock) -> [u8; SB_BYTES] {
    let mut i = ffi::tc_sb_info {
        layout: s.layout.to_c(),
        commit_seq: s.commit_seq,
        origin_sectors: s.origin_sectors,
        version: s.version,
        gen_: s.generation,
        flags: s.flags,
        epoch: s.epoch,
        uuid: [0; ffi::TC_UUID_BYTES as usize + 1],
    };
    for (d, c) in i
        .uuid
        .iter_mut()
        .zip(s.uuid.bytes().take(ffi::TC_UUID_BYTES as usize))
    {
        *d = c as std::os::raw::c_char;
    }
    let mut sb = ffi::tc_disk_sb::default();
    // SAFETY: both pointers are to live, properly aligned structs.
    unsafe { ffi::tc_sb_encode(&mut sb, &i) };
    let mut out = sb_bytes(&sb);
    if s.version != s.layout.version() {
        let v = std::mem::offset_of!(ffi::tc_disk_sb, version);
        let c = std::mem::offset_of!(ffi::tc_disk_sb, csum);
        out[v..v + 4].copy_from_slice(&s.version.to_le_bytes());
        out[c..c + 4].fill(0);
        let sum = crc(&out);
        out[c..c + 4].copy_from_slice(&sum.to_le_bytes());
    }
    out
}

// --------------------------------------------------------------------
// Entries
// --------------------------------------------------------------------

/// What `tc_de_decode` says about one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    Empty,
    /// Of another format generation (an earlier format's entry), or bytes
    /// the device held before: empty.
    Foreign,
    Clean,
    Dirty,
    Uncommitted,
    /// Of this generation and slot with a bad checksum, or damaged in its
    /// generation or slot word alone (the checksum holds with it put back).
    BadCsum,
    /// Of this generation, valid, but another slot's: a misdirected write.
    BadSlot,
    BadFlags,
    BadBlock,
}

impl EntryState {
    fn from_c(r: ffi::tc_de_result) -> EntryState {
        match r {
            ffi::tc_de_result::TC_DE_EMPTY => EntryState::Empty,
            ffi::tc_de_result::TC_DE_FOREIGN => EntryState::Foreign,
            ffi::tc_de_result::TC_DE_CLEAN => EntryState::Clean,
            ffi::tc_de_result::TC_DE_DIRTY_OK => EntryState::Dirty,
            ffi::tc_de_result::TC_DE_UNCOMMITTED => EntryState::Uncommitted,
            ffi::tc_de_result::TC_DE_BAD_CSUM => EntryState::BadCsum,
            ffi::tc_de_result::TC_DE_BAD_SLOT => EntryState::BadSlot,
            ffi::tc_de_result::TC_DE_BAD_FLAGS => EntryState::BadFlags,
            _ => EntryState::BadBlock,
        }
    }
    fn to_c(self) -> ffi::tc_de_result {
        match self {
            EntryState::Empty => ffi::tc_de_result::TC_DE_EMPTY,
            EntryState::Foreign => ffi::tc_de_result::TC_DE_FOREIGN,
            EntryState::Clean => ffi::tc_de_result::TC_DE_CLEAN,
            EntryState::Dirty => ffi::tc_de_result::TC_DE_DIRTY_OK,
            EntryState::Uncommitted => ffi::tc_de_result::TC_DE_UNCOMMITTED,
            EntryState::BadCsum => ffi::tc_de_result::TC_DE_BAD_CSUM,
            EntryState::BadSlot => ffi::tc_de_result::TC_DE_BAD_SLOT,
            EntryState::BadFlags => ffi::tc_de_result::TC_DE_BAD_FLAGS,
            EntryState::BadBlock => ffi::tc_de_result::TC_DE_BAD_BLOCK,
        }
    }
    /// The C code's description (`tc_de_result_str`).
    pub fn describe(self) -> &'static str {
        // SAFETY: plain value in, static string out.
        c_str(unsafe { ffi::tc_de_result_str(self.to_c()) })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Empty => "empty",
            EntryState::Foreign => "foreign",
            EntryState::Clean => "clean",
            EntryState::Dirty => "dirty",
            EntryState::Uncommitted => "uncommitted",
            EntryState::BadCsum => "bad_csum",
            EntryState::BadSlot => "bad_slot",
            EntryState::BadFlags => "bad_flags",
            EntryState::BadBlock => "bad_block",
        }
    }
    pub fn is_corrupt(self) -> bool {
        matches!(
            self,
            EntryState::BadCsum | EntryState::BadSlot | EntryState::BadFlags | EntryState::BadBlock
        )
    }
}

/// One decoded entry.  `block`, `seq` and `dirty` are what the entry says
/// when the C decoder got that far (not for empty or foreign entries,
/// checksum or flag errors); `epoch` is then, for a dirty version, its
/// absolute epoch (`disk_epoch` of the superblock's epoch and the entry's
/// bits; 0 before version 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub slot: u64,
    pub state: EntryState,
    pub block: Option<u64>,
    pub seq: Option<u64>,
    pub dirty: Option<bool>,
    pub epoch: Option<u64>,
}

fn entry_from_bytes(raw: &[u8]) -> ffi::tc_disk_entry {
    let mut d = ffi::tc_disk_entry::default();
    let n = raw.len().min(ENTRY_BYTES);
    // SAFETY: d is ENTRY_BYTES of plain data; at most that many are copied.
    unsafe {
        std::ptr::copy_nonoverlapping(raw.as_ptr(), (&mut d as *mut ffi::tc_disk_entry).cast(), n)
    };
    d
}

/// Decode the entry of `slot` under superblock `sb` (`tc_de_decode` with
/// its origin size, commit sequence, generation and version; the epoch
/// made absolute with its epoch).
pub fn decode_entry(raw: &[u8], slot: u64, sb: &Superblock) -> Entry {
    let d = entry_from_bytes(raw);
    let mut i = ffi::tc_de_info::default();
    // SAFETY: both pointers are to live, properly aligned structs.
    let st = EntryState::from_c(unsafe {
        ffi::tc_de_decode(
            &d,
            slot,
            sb.origin_blocks(),
            sb.commit_seq,
            sb.generation,
            sb.version,
            &mut i,
        )
    });
    let fields = matches!(
        st,
        EntryState::Clean | EntryState::Dirty | EntryState::Uncommitted | EntryState::BadBlock
    );
    Entry {
        slot,
        state: st,
        block: fields.then_some(i.block),
        seq: fields.then_some(i.seq),
        dirty: fields.then_some(i.dirty),
        epoch: (fields && i.dirty).then(|| disk_epoch(sb.epoch, i.epoch)),
    }
}

fn entry_bytes(d: &ffi::tc_disk_entry) -> [u8; ENTRY_BYTES] {
    let mut out = [0u8; ENTRY_BYTES];
    // SAFETY: d is ENTRY_BYTES of plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (d as *const ffi::tc_disk_entry).cast::<u8>(),
            out.as_mut_ptr(),
            ENTRY_BYTES,
        )
    };
    out
}

/// Encode an entry of format generation `generation` (`tc_de_encode`):
/// of a dirty version, the low 16 bits of `epoch` are written; a clean
/// entry has none.
pub fn encode_entry(
    slot: u64,
    block: u64,
    dirty: bool,
    seq: u64,
    generation: u32,
    epoch: u64,
) -> [u8; ENTRY_BYTES] {
    let mut d = ffi::tc_disk_entry::default();
    // SAFETY: d is a live struct.
    unsafe { ffi::tc_de_encode(&mut d, slot, block, dirty, seq, generation, epoch as u16) };
    entry_bytes(&d)
}

/// An empty entry (`tc_de_encode_empty`).
#[cfg(test)]
pub fn encode_empty_entry() -> [u8; ENTRY_BYTES] {
    let mut d = ffi::tc_disk_entry::default();
    // SAFETY: d is a live struct.
    unsafe { ffi::tc_de_encode_empty(&mut d) };
    entry_bytes(&d)
}

/// Byte offset of the entry of `slot`.
pub fn entry_offset(l: &Layout, slot: u64) -> u64 {
    let per = entries_per_mblock();
    l.meta_start * 512 + (slot / per) * MBLOCK_BYTES as u64 + (slot % per) * ENTRY_BYTES as u64
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// --------------------------------------------------------------------
// Devices
// --------------------------------------------------------------------

/// Something metadata can be read from: a device, an image file, or a
/// test's in-memory image.
pub trait ReadAt {
    /// The device or file, for messages.
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    /// Exactly `len` bytes at `off`.
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>>;
}

/// A device opened to write its superblock (exclusively, for a block
/// device): a device, an image file, or a test's in-memory image.
pub trait WriteAt: ReadAt {
    fn write_at(&self, off: u64, data: &[u8]) -> Result<()>;
    /// Make what was written durable.
    fn sync(&self) -> Result<()>;
    /// The device number of the open file (fstat); None for a regular file.
    fn devno(&self) -> Option<(u32, u32)>;
}

/// Alignment of O_DIRECT buffers, offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(DIRECT_ALIGN), DIRECT_ALIGN)
            .expect("buffer layout");
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr owns layout.size() initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// How a device is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only, shared: the device may be in use.
    Read,
    /// Read only, and for block devices an exclusive open (O_EXCL):
    /// refused while the device is mounted or held by a device-mapper
    /// device, and no one can claim it while we hold it.
    ReadExclusive,
    /// Read and write, exclusive as above.
    WriteExclusive,
}

/// A block device or a regular file (an image, in tests).
pub struct Dev {
    file: File,
    path: String,
    size: u64,
    direct: bool,
    /// Device number of a block device.
    pub devno: Option<(u32, u32)>,
    /// Device and inode, to tell two paths of one file apart.
    pub ident: (u64, u64),
}

fn io_msg(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or("").to_string()
}

/// Who holds a block device, from sysfs: "dm-3 (vg-data)".
pub fn holders(devno: (u32, u32)) -> Vec<String> {
    let dir = format!("/sys/dev/block/{}:{}/holders", devno.0, devno.1);
    let mut v = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            match std::fs::read_to_string(format!("/sys/block/{n}/dm/name")) {
                Ok(d) => v.push(format!("{n} ({})", d.trim())),
                Err(_) => v.push(n),
            }
        }
    }
    v.sort();
    v
}

impl Dev {
    pub fn open(path: &str, access: Access) -> Result<Dev> {
        let unreadable = |what: String| Error::new(Kind::Unreadable, what);
        let md = std::fs::metadata(path).map_err(|e| {
            unreadable(format!("{path}: cannot open: {}", io_msg(&e)))
                .hint("give the path of the device (or image file)")
        })?;
        let blk = md.file_type().is_block_device();
        if !blk && !md.file_type().is_file() {
            return Err(unreadable(format!(
                "{path}: not a block device or regular file"
            )));
        }
        let devno = blk.then(|| (libc::major(md.rdev()), libc::minor(md.rdev())));
        let mut oo = OpenOptions::new();
        oo.read(true);
        let mut flags = 0;
        if blk {
            flags |= libc::O_DIRECT;
        }
        if access == Access::WriteExclusive {
            oo.write(true);
        }
        if access != Access::Read && blk {
            flags |= libc::O_EXCL;
        }
        oo.custom_flags(flags);
        let file = oo.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => {
                let by = devno.map(holders).unwrap_or_default();
                let who = if by.is_empty() {
                    "mounted, or open exclusively by another program".to_string()
                } else {
                    format!("held by {}", by.join(", "))
                };
                busy(format!("{path}: in use ({who})")).hint(
                    "remove the device that uses it first (a live cache is written back with 'tiercache flush', not offline)",
                )
            }
            Some(libc::EACCES) | Some(libc::EPERM) => {
                unreadable(format!("{path}: cannot open: permission denied")).hint("run as root")
            }
            _ => unreadable(format!("{path}: cannot open: {}", io_msg(&e))),
        })?;
        // What was opened (fstat), not what the path named a moment ago.
        let md = file
            .metadata()
            .map_err(|e| unreadable(format!("{path}: cannot stat: {}", io_msg(&e))))?;
        if md.file_type().is_block_device() != blk {
            return Err(unreadable(format!("{path}: changed while it was opened")));
        }
        let devno = blk.then(|| (libc::major(md.rdev()), libc::minor(md.rdev())));
        let size = if blk {
            use std::io::{Seek, SeekFrom};
            (&file)
                .seek(SeekFrom::End(0))
                .map_err(|e| unreadable(format!("{path}: cannot get the size: {}", io_msg(&e))))?
        } else {
            md.len()
        };
        Ok(Dev {
            file,
            path: path.to_string(),
            size,
            direct: blk,
            devno,
            ident: (md.dev(), md.ino()),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn io_err(&self, what: &str, off: u64, e: &std::io::Error) -> Error {
        Error::new(
            Kind::Unreadable,
            format!("{}: {what} error at byte {off}: {}", self.path, io_msg(e)),
        )
    }

    /// Write `data` at `off`.  On block devices both must be 4 KiB aligned.
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        if self.direct {
            if off % DIRECT_ALIGN as u64 != 0 || data.len() % DIRECT_ALIGN != 0 {
                return Err(Error::new(
                    Kind::Failure,
                    format!(
                        "{}: unaligned write of {} bytes at {off} (internal error)",
                        self.path,
                        data.len()
                    ),
                ));
            }
            let mut b = AlignedBuf::new(data.len());
            b.as_mut_slice()[..data.len()].copy_from_slice(data);
            self.file
                .write_all_at(&b.as_slice()[..data.len()], off)
                .map_err(|e| self.io_err("write", off, &e))
        } else {
            self.file
                .write_all_at(data, off)
                .map_err(|e| self.io_err("write", off, &e))
        }
    }

    /// Make everything written durable (fsync: a cache flush on devices).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_all().map_err(|e| {
            Error::new(
                Kind::Unreadable,
                format!("{}: fsync failed: {}", self.path, io_msg(&e)),
            )
        })
    }
}

impl WriteAt for Dev {
    fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        Dev::write_at(self, off, data)
    }
    fn sync(&self) -> Result<()> {
        Dev::sync(self)
    }
    fn devno(&self) -> Option<(u32, u32)> {
        self.devno
    }
}

impl ReadAt for Dev {
    fn name(&self) -> &str {
        &self.path
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off.checked_add(len as u64).filter(|&e| e <= self.size);
        if end.is_none() {
            return Err(Error::new(
                Kind::Unreadable,
                format!(
                    "{}: read of {len} bytes at byte {off} is beyond its end ({} bytes)",
                    self.path, self.size
                ),
            ));
        }
        if !self.direct {
            let mut v = vec![0u8; len];
            self.file
                .read_exact_at(&mut v, off)
                .map_err(|e| self.io_err("read", off, &e))?;
            return Ok(v);
        }
        // O_DIRECT: widen to aligned offsets and lengths.
        let a = DIRECT_ALIGN as u64;
        let start = off / a * a;
        let stop = (off + len as u64).div_ceil(a) * a;
        let mut b = AlignedBuf::new((stop - start) as usize);
        // The last 4 KiB of a device with 512-byte sectors may be partial.
        let want = (stop.min(self.size) - start) as usize;
        self.file
            .read_exact_at(&mut b.as_mut_slice()[..want], start)
            .map_err(|e| self.io_err("read", off, &e))?;
        let skip = (off - start) as usize;
        Ok(b.as_slice()[skip..skip + len].to_vec())
    }
}

// --------------------------------------------------------------------
// Reading a cache device's metadata
// --------------------------------------------------------------------

/// The superblock of a device, as read.
#[derive(Clone, Debug)]
pub struct SbRead {
    pub dev_bytes: u64,
    pub state: SbState,
    pub sb: Option<Superblock>,
    /// The first sector as read (zero padded on a tiny device).
    pub raw: Vec<u8>,
}

pub fn read_superblock(dev: &dyn ReadAt) -> Result<SbRead> {
    let size = dev.size_bytes();
    let n = (SB_SECTORS * 512).min(size) as usize;
    let mut raw = if n > 0 { dev.read_at(0, n)? } else { vec![] };
    raw.resize(SB_BYTES.max(raw.len()), 0);
    raw.truncate(SB_BYTES);
    let (state, sb) = decode_sb(&raw);
    Ok(SbRead {
        dev_bytes: size,
        state,
        sb,
        raw,
    })
}

impl SbRead {
    /// Why this superblock cannot be used: no superblock (exit 11), or a
    /// bad one or one describing more than the device holds (exit 12).
    pub fn problem(&self, dev: &str) -> Option<Error> {
        match (self.state, &self.sb) {
            (SbState::Ok, Some(sb)) => {
                let need = sb.layout.end_sector();
                let have = self.dev_bytes / 512;
                (need > have).then(|| {
                    Error::new(
                        Kind::BadSuperblock,
                        format!(
                            "{dev}: the superblock describes {need} sectors ({} slots from sector {}), but the device has {have}",
                            sb.layout.nr_slots, sb.layout.data_start
                        ),
                    )
                    .hint("the device shrank, or this superblock belongs to a larger device")
                })
            }
            (SbState::Blank, _) => Some(
                Error::new(
                    Kind::NoSuperblock,
                    format!("{dev}: {}", SbState::Blank.describe()),
                )
                .hint("this is not a tiercache cache device, or it was never used by one"),
            ),
            (st, _) => Some(Error::new(
                Kind::BadSuperblock,
                format!("{dev}: {}", st.describe()),
            )),
        }
    }

    /// Whether the entry area lies within the device (a superblock that
    /// decodes but describes a larger device may still have its entries).
    pub fn entries_readable(&self) -> bool {
        self.sb
            .as_ref()
            .is_some_and(|sb| sb.layout.meta_end_sector() * 512 <= self.dev_bytes)
    }

    /// Whether the summary lies within the device too (no summary: false).
    pub fn summary_readable(&self) -> bool {
        self.sb.as_ref().is_some_and(|sb| {
            sb.has_summary() && sb.layout.sum_end_sector() * 512 <= self.dev_bytes
        })
    }
}

/// Call `f` for every slot's entry, in slot order, with its raw bytes.
pub fn for_each_entry(
    dev: &dyn ReadAt,
    sb: &Superblock,
    mut f: impl FnMut(&Entry, &[u8]) -> Result<()>,
) -> Result<()> {
    let l = &sb.layout;
    let per = entries_per_mblock();
    let chunk_mblocks: u64 = 256;
    let mut mb = 0;
    while mb < l.meta_blocks {
        let n = chunk_mblocks.min(l.meta_blocks - mb);
        let off = l.meta_start * 512 + mb * MBLOCK_BYTES as u64;
        let buf = dev.read_at(off, (n as usize) * MBLOCK_BYTES)?;
        for (k, raw) in buf.chunks_exact(ENTRY_BYTES).enumerate() {
            let slot = mb * per + k as u64;
            if slot >= l.nr_slots {
                break;
            }
            let e = decode_entry(raw, slot, sb);
            f(&e, raw)?;
        }
        mb += n;
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub empty: u64,
    /// Entries of another format generation or slot: empty slots too,
    /// counted apart (not errors).
    pub foreign: u64,
    pub clean: u64,
    pub dirty: u64,
    pub uncommitted: u64,
    pub corrupt: u64,
}

impl Counts {
    pub fn used(&self) -> u64 {
        self.clean + self.dirty + self.uncommitted + self.corrupt
    }
}

/// A corrupt entry: which slot, and what the decoder said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BadEntry {
    pub slot: u64,
    pub state: EntryState,
    pub reason: &'static str,
    /// What the entry says, when the decoder got that far (an origin
    /// block out of range).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty: Option<bool>,
    /// The 32 bytes of the entry, in hex.
    pub raw: String,
}

/// A committed dirty entry: a dirty version of an origin block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DirtyRef {
    pub block: u64,
    pub slot: u64,
    pub seq: u64,
    /// Its absolute epoch (0 before version 3).
    pub epoch: u64,
}

/// Several committed dirty entries for one origin block and one epoch
/// (in versions 1 and 2, where every entry is of epoch 0: for one block).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Duplicate {
    pub block: u64,
    pub epoch: u64,
    pub slots: Vec<u64>,
    pub seqs: Vec<u64>,
}

/// The dirty versions of one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EpochCount {
    pub epoch: u64,
    /// Committed dirty entries of this epoch.
    pub dirty: u64,
}

/// A metadata block holding entries of ours with the DIRTY flag,
/// committed or not: the summary of a version 4 cache must mark it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DirtyMblock {
    pub mblock: u64,
    /// The first slot of such an entry in it, for messages.
    pub first_slot: u64,
    /// How many such entries it holds.
    pub entries: u64,
}

/// Everything `check` and `writeback` need from the entries.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Survey {
    pub counts: Counts,
    pub corrupt: Vec<BadEntry>,
    /// Committed dirty entries, by origin block, epoch, then slot.
    pub dirty: Vec<DirtyRef>,
    /// One origin block dirty in several slots of one epoch: the metadata
    /// does not say which is current (the module refuses to load it).
    pub duplicates: Vec<Duplicate>,
    /// The metadata blocks holding entries with the DIRTY flag (committed,
    /// uncommitted, or beyond the origin), in order: what the summary rule
    /// covers.
    pub dirty_mblocks: Vec<DirtyMblock>,
}

impl Survey {
    /// Committed dirty entries as the module counts them before a
    /// `format` (any origin block: it does not know the old origin's
    /// size), which it refuses if there are any.
    pub fn dirty_for_format(&self, commit_seq: u64) -> u64 {
        self.counts.dirty
            + self
                .corrupt
                .iter()
                .filter(|b| {
                    b.state == EntryState::BadBlock
                        && b.dirty == Some(true)
                        && b.seq.is_some_and(|q| q <= commit_seq)
                })
                .count() as u64
    }

    /// The dirty versions to write back, oldest epoch first and by
    /// origin block within an epoch: every committed dirty entry but
    /// those of a block with a duplicate (all its versions are left out:
    /// its chain of versions is not known).
    pub fn versions_to_write(&self) -> Vec<DirtyRef> {
        let dup: std::collections::HashSet<u64> = self.duplicates.iter().map(|d| d.block).collect();
        let mut v: Vec<DirtyRef> = self
            .dirty
            .iter()
            .filter(|d| !dup.contains(&d.block))
            .copied()
            .collect();
        v.sort_by_key(|d| (d.epoch, d.block, d.slot));
        v
    }

    /// The epochs of the committed dirty entries, oldest first.
    pub fn epochs(&self) -> Vec<EpochCount> {
        let mut m = std::collections::BTreeMap::new();
        for d in &self.dirty {
            *m.entry(d.epoch).or_insert(0u64) += 1;
        }
        m.into_iter()
            .map(|(epoch, dirty)| EpochCount { epoch, dirty })
            .collect()
    }

    /// Origin blocks dirty in more than one epoch (a chain of versions).
    pub fn versioned_blocks(&self) -> u64 {
        let mut n = 0;
        let mut i = 0;
        while i < self.dirty.len() {
            let b = self.dirty[i].block;
            let mut j = i + 1;
            let mut several = false;
            while j < self.dirty.len() && self.dirty[j].block == b {
                several |= self.dirty[j].epoch != self.dirty[i].epoch;
                j += 1;
            }
            n += several as u64;
            i = j;
        }
        n
    }

    /// Distinct origin blocks of `versions` (dirty versions).
    pub fn origin_blocks_of(versions: &[DirtyRef]) -> u64 {
        versions
            .iter()
            .map(|d| d.block)
            .collect::<std::collections::HashSet<u64>>()
            .len() as u64
    }
}

/// Note the metadata block of entry `e` in `v` if the entry is one of ours
/// with the DIRTY flag.  Uncommitted entries count: the module keeps the
/// summary bit set before a commit writes a dirty entry, finished or not;
/// and an entry beyond the origin still says dirty (the decoder got that
/// far).  Entries come in slot order, so one metadata block's are together.
fn note_dirty_mblock(v: &mut Vec<DirtyMblock>, e: &Entry) {
    if e.dirty != Some(true) {
        return;
    }
    let mblock = e.slot / entries_per_mblock();
    match v.last_mut() {
        Some(d) if d.mblock == mblock => d.entries += 1,
        _ => v.push(DirtyMblock {
            mblock,
            first_slot: e.slot,
            entries: 1,
        }),
    }
}

pub fn survey(dev: &dyn ReadAt, sb: &Superblock) -> Result<Survey> {
    let mut s = Survey::default();
    for_each_entry(dev, sb, |e, raw| {
        note_dirty_mblock(&mut s.dirty_mblocks, e);
        match e.state {
            EntryState::Empty => s.counts.empty += 1,
            EntryState::Foreign => s.counts.foreign += 1,
            EntryState::Clean => s.counts.clean += 1,
            EntryState::Uncommitted => s.counts.uncommitted += 1,
            EntryState::Dirty => {
                s.counts.dirty += 1;
                s.dirty.push(DirtyRef {
                    block: e.block.unwrap_or(0),
                    slot: e.slot,
                    seq: e.seq.unwrap_or(0),
                    epoch: e.epoch.unwrap_or(0),
                });
            }
            st => {
                s.counts.corrupt += 1;
                s.corrupt.push(BadEntry {
                    slot: e.slot,
                    state: st,
                    reason: st.describe(),
                    block: e.block,
                    seq: e.seq,
                    dirty: e.dirty,
                    raw: hex(raw),
                });
            }
        }
        Ok(())
    })?;
    // The version-chain rule: one origin block may be dirty in several
    // slots if their epochs all differ (version 3); two of one epoch are
    // corruption (in versions 1 and 2, all of epoch 0: any two).
    s.dirty.sort_by_key(|d| (d.block, d.epoch, d.slot));
    let mut i = 0;
    while i < s.dirty.len() {
        let key = |d: &DirtyRef| (d.block, d.epoch);
        let mut j = i + 1;
        while j < s.dirty.len() && key(&s.dirty[j]) == key(&s.dirty[i]) {
            j += 1;
        }
        if j - i > 1 {
            s.duplicates.push(Duplicate {
                block: s.dirty[i].block,
                epoch: s.dirty[i].epoch,
                slots: s.dirty[i..j].iter().map(|d| d.slot).collect(),
                seqs: s.dirty[i..j].iter().map(|d| d.seq).collect(),
            });
        }
        i = j;
    }
    Ok(s)
}

// --------------------------------------------------------------------
// The summary (version 4)
// --------------------------------------------------------------------

/// Bytes of one summary block.
pub const SUM_BYTES: usize = std::mem::size_of::<ffi::tc_disk_sum>();
/// Metadata blocks one summary block covers (TC_SUM_BITS).
pub const SUM_BITS: u64 = ffi::TC_SUM_BITS as u64;

/// What `tc_sum_decode` says about a summary block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SumState {
    /// Of this generation and index, checksum right: its bits hold.
    Ok,
    /// Anything else (torn, damaged, zeroed, misplaced, another
    /// generation's: a format writes every summary block, so none of this
    /// format's reads so): every metadata block of its range reads as
    /// marked.
    Bad,
}

impl SumState {
    fn from_c(r: ffi::tc_sum_result) -> SumState {
        match r {
            ffi::tc_sum_result::TC_SUM_OK => SumState::Ok,
            _ => SumState::Bad,
        }
    }
    fn to_c(self) -> ffi::tc_sum_result {
        match self {
            SumState::Ok => ffi::tc_sum_result::TC_SUM_OK,
            SumState::Bad => ffi::tc_sum_result::TC_SUM_BAD,
        }
    }
    /// The C code's description (`tc_sum_result_str`).
    pub fn describe(self) -> &'static str {
        // SAFETY: plain value in, static string out.
        c_str(unsafe { ffi::tc_sum_result_str(self.to_c()) })
    }
}

fn sum_from_bytes(raw: &[u8]) -> Box<ffi::tc_disk_sum> {
    let mut s = Box::<ffi::tc_disk_sum>::default();
    let n = raw.len().min(SUM_BYTES);
    // SAFETY: s is SUM_BYTES of plain data; at most that many are copied.
    unsafe {
        std::ptr::copy_nonoverlapping(raw.as_ptr(), (&mut *s as *mut ffi::tc_disk_sum).cast(), n)
    };
    s
}

/// One summary block, decoded.
pub struct SumBlock {
    /// Its number in the summary.
    pub index: u64,
    pub state: SumState,
    /// The block as read, for its bits (kept whole: tc_sum_test reads it).
    raw: Box<ffi::tc_disk_sum>,
}

impl SumBlock {
    /// Decode summary block `index` under format generation `generation`
    /// (`tc_sum_decode`).
    pub fn decode(raw: &[u8], index: u64, generation: u32) -> SumBlock {
        let raw = sum_from_bytes(raw);
        // SAFETY: a live struct in, a plain value out.  The summary of a
        // 2^32-slot cache has about a thousand blocks: index fits in 32 bits.
        let state =
            SumState::from_c(unsafe { ffi::tc_sum_decode(&*raw, index as u32, generation) });
        SumBlock { index, state, raw }
    }
    /// The first metadata block it covers.
    pub fn first_mblock(&self) -> u64 {
        self.index * SUM_BITS
    }
    /// How many of the cache's `meta_blocks` it covers (the last block of
    /// the summary covers the rest).
    pub fn covers(&self, meta_blocks: u64) -> u64 {
        meta_blocks
            .saturating_sub(self.first_mblock())
            .min(SUM_BITS)
    }
    /// Does it mark metadata block `mblock` (one of its range)?  Valid: its
    /// bit (`tc_sum_test`); bad: yes, as the module reads it.
    pub fn marks(&self, mblock: u64) -> bool {
        match self.state {
            SumState::Bad => true,
            // SAFETY: a live struct; the bit number is below SUM_BITS.
            SumState::Ok => unsafe {
                ffi::tc_abi_sum_test(&*self.raw, (mblock - self.first_mblock()) as u32)
            },
        }
    }
    /// How many of the cache's `meta_blocks` of its range it marks.
    pub fn marked(&self, meta_blocks: u64) -> u64 {
        let first = self.first_mblock();
        (first..first + self.covers(meta_blocks))
            .filter(|&mb| self.marks(mb))
            .count() as u64
    }
}

/// The summary of a version 4 cache, as the module's load reads it.
pub struct Summary {
    pub meta_blocks: u64,
    pub blocks: Vec<SumBlock>,
}

impl Summary {
    /// The summary block covering metadata block `mblock`.
    pub fn block_of(&self, mblock: u64) -> &SumBlock {
        &self.blocks[(mblock / SUM_BITS) as usize]
    }
    /// Is metadata block `mblock` marked ("may hold a dirty entry")?
    pub fn marks(&self, mblock: u64) -> bool {
        self.block_of(mblock).marks(mblock)
    }
    /// Metadata blocks marked, in all (those of bad blocks included).
    pub fn marked(&self) -> u64 {
        self.blocks.iter().map(|b| b.marked(self.meta_blocks)).sum()
    }
    /// The blocks of `dirty` (metadata blocks holding dirty entries) it
    /// does not mark: the module's load, reading only marked blocks, would
    /// not see their dirty entries.
    pub fn unmarked(&self, dirty: &[DirtyMblock]) -> Vec<DirtyMblock> {
        dirty
            .iter()
            .filter(|d| !self.marks(d.mblock))
            .copied()
            .collect()
    }
}

/// Read and decode the summary of `sb`'s cache; `None` before version 4.
pub fn read_summary(dev: &dyn ReadAt, sb: &Superblock) -> Result<Option<Summary>> {
    let l = &sb.layout;
    if !l.has_summary() {
        return Ok(None);
    }
    let chunk_blocks: u64 = 256;
    let mut blocks = Vec::with_capacity(l.sum_blocks as usize);
    let mut k = 0;
    while k < l.sum_blocks {
        let n = chunk_blocks.min(l.sum_blocks - k);
        let off = l.sum_start * 512 + k * SUM_BYTES as u64;
        let buf = dev.read_at(off, n as usize * SUM_BYTES)?;
        for (j, raw) in buf.chunks_exact(SUM_BYTES).enumerate() {
            blocks.push(SumBlock::decode(raw, k + j as u64, sb.generation));
        }
        k += n;
    }
    Ok(Some(Summary {
        meta_blocks: l.meta_blocks,
        blocks,
    }))
}

#[cfg(test)]
fn sum_bytes(s: &ffi::tc_disk_sum) -> Vec<u8> {
    let mut out = vec![0u8; SUM_BYTES];
    // SAFETY: s is SUM_BYTES bytes of plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (s as *const ffi::tc_disk_sum).cast::<u8>(),
            out.as_mut_ptr(),
            SUM_BYTES,
        )
    };
    out
}

/// Summary block `index` of generation `generation` marking the metadata
/// blocks `mblocks` (numbers in the whole cache, of its range), sealed
/// (`tc_sum_set`, `tc_sum_seal`), as the module writes it.  The tool
/// writes no summary: for tests.
#[cfg(test)]
pub fn encode_sum(index: u64, generation: u32, mblocks: &[u64]) -> Vec<u8> {
    let mut s = Box::<ffi::tc_disk_sum>::default();
    for &mb in mblocks {
        let j = mb - index * SUM_BITS;
        assert!(
            j < SUM_BITS,
            "metadata block {mb} is not of summary block {index}"
        );
        // SAFETY: a live struct; the bit number is below SUM_BITS.
        unsafe { ffi::tc_abi_sum_set(&mut *s, j as u32) };
    }
    // SAFETY: a live struct.
    unsafe { ffi::tc_sum_seal(&mut *s, index as u32, generation) };
    sum_bytes(&s)
}

/// An in-memory device image, for tests.
#[cfg(test)]
#[derive(Clone, Debug)]
pub struct MemImage {
    pub name: String,
    pub data: Vec<u8>,
}

#[cfg(test)]
impl ReadAt for MemImage {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let o = off as usize;
        self.data
            .get(o..o + len)
            .map(|s| s.to_vec())
            .ok_or_else(|| {
                Error::new(
                    Kind::Unreadable,
                    format!("{}: read beyond the end", self.name),
                )
            })
    }
}

/// Pseudo-random bytes (xorshift64), the same on every run: what a
/// device held before it was formatted.  For tests.
#[cfg(test)]
pub fn garbage(buf: &mut [u8], mut x: u64) {
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Build a formatted cache image of `cache_sectors` with the given entries
/// `(slot, block, dirty, seq)`, dirty ones of the superblock's epoch, the
/// data of each entry's slot filled with `fill(block)`; with a summary
/// (version 4), every summary block written sealed (as a format writes
/// it) with the metadata blocks of the dirty entries marked, as the module
/// leaves them.  For tests, here so that every test builds
/// images the same way (through the C encoder).
#[cfg(test)]
pub fn build_image(
    sb: &Superblock,
    cache_sectors: u64,
    entries: &[(u64, u64, bool, u64)],
    fill: impl Fn(u64) -> u8,
) -> Vec<u8> {
    let es: Vec<(u64, u64, bool, u64, u64)> = entries
        .iter()
        .map(|&(s, b, d, q)| (s, b, d, q, sb.epoch))
        .collect();
    build_image_epochs(sb, cache_sectors, &es, |b, _| fill(b))
}

/// `build_image` with the epoch of each entry: `(slot, block, dirty, seq,
/// epoch)`, the data of its slot filled with `fill(block, epoch)`.
#[cfg(test)]
pub fn build_image_epochs(
    sb: &Superblock,
    cache_sectors: u64,
    entries: &[(u64, u64, bool, u64, u64)],
    fill: impl Fn(u64, u64) -> u8,
) -> Vec<u8> {
    let mut img = vec![0u8; (cache_sectors * 512) as usize];
    img[..SB_BYTES].copy_from_slice(&encode_sb(sb));
    let l = &sb.layout;
    for &(slot, block, dirty, seq, epoch) in entries {
        let off = entry_offset(l, slot) as usize;
        img[off..off + ENTRY_BYTES].copy_from_slice(&encode_entry(
            slot,
            block,
            dirty,
            seq,
            sb.generation,
            epoch,
        ));
        let d = l.slot_offset(slot) as usize;
        let bb = l.block_bytes() as usize;
        img[d..d + bb].fill(fill(block, epoch));
    }
    let dirty: Vec<u64> = entries
        .iter()
        .filter(|e| e.2)
        .map(|e| e.0 / entries_per_mblock())
        .collect();
    write_summary(&mut img, sb, &dirty);
    img
}

/// Byte offset of summary block `index`.
#[cfg(test)]
pub fn sum_offset(l: &Layout, index: u64) -> u64 {
    l.sum_start * 512 + index * SUM_BYTES as u64
}

/// Write the whole summary of image `img` (none before version 4: nothing
/// to do), every block sealed in the superblock's generation, as a format
/// writes it, marking exactly the metadata blocks `mblocks` (each summary
/// block with none of them all clear).  For tests.
#[cfg(test)]
pub fn write_summary(img: &mut [u8], sb: &Superblock, mblocks: &[u64]) {
    let l = &sb.layout;
    for k in 0..l.sum_blocks {
        let mine: Vec<u64> = mblocks
            .iter()
            .copied()
            .filter(|mb| mb / SUM_BITS == k)
            .collect();
        let o = sum_offset(l, k) as usize;
        img[o..o + SUM_BYTES].copy_from_slice(&encode_sum(k, sb.generation, &mine));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_and_rust_agree_on_the_structures() {
        // What clang computed from tc_disk.h (csrc/tc_disk_abi.c) against
        // the layout of the generated Rust structures.
        assert_eq!(ffi::tc_abi_sb_size as usize, SB_BYTES);
        assert_eq!(ffi::tc_abi_entry_size as usize, ENTRY_BYTES);
        assert_eq!(
            ffi::tc_abi_sb_uuid_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_sb, uuid)
        );
        assert_eq!(
            ffi::tc_abi_entry_csum_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_entry, csum)
        );
        assert_eq!(
            ffi::tc_abi_sb_gen_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_sb, gen_)
        );
        assert_eq!(std::mem::offset_of!(ffi::tc_disk_sb, gen_), 192);
        assert_eq!(
            ffi::tc_abi_entry_gen_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_entry, gen_)
        );
        assert_eq!(std::mem::offset_of!(ffi::tc_disk_entry, gen_), 28);
        assert_eq!(
            ffi::tc_abi_sb_epoch_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_sb, epoch)
        );
        assert_eq!(std::mem::offset_of!(ffi::tc_disk_sb, epoch), 200);
        assert_eq!(
            ffi::tc_abi_entry_flags_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_entry, flags)
        );
        assert_eq!(ffi::TC_DE_EPOCH_SHIFT, 16);
        assert_eq!(ffi::TC_DE_EPOCH_MASK, 0xffff_0000);
        assert_eq!((VERSION, VERSION_V3, VERSION_V2), (4, 3, 2));
        assert_eq!(ffi::tc_abi_sum_size as usize, SUM_BYTES);
        assert_eq!(SUM_BYTES, MBLOCK_BYTES);
        assert_eq!(
            ffi::tc_abi_sum_bits_offset as usize,
            std::mem::offset_of!(ffi::tc_disk_sum, bits)
        );
        assert_eq!(SUM_BITS, (MBLOCK_BYTES as u64 - 16) * 8);
        assert_eq!(SB_BYTES, 512);
        assert_eq!(ENTRY_BYTES, 32);
        assert_eq!(entries_per_mblock() as usize, MBLOCK_BYTES / ENTRY_BYTES);
        assert_eq!(magic(), "TIERCACH");
    }

    #[test]
    fn crc_check_value() {
        assert_eq!(crc(b"123456789"), 0xe3069283);
    }

    fn sample() -> Superblock {
        Superblock {
            layout: layout(4096, 8).unwrap(),
            commit_seq: 9,
            origin_sectors: 8192,
            uuid: "TIERCACHE-t".into(),
            version: VERSION,
            generation: G,
            flags: 0,
            epoch: 0,
        }
    }

    /// `sample()` in the layout of format `version` (1: generation 0).
    fn sample_v(version: u32) -> Superblock {
        Superblock {
            layout: layout_v(4096, 8, version).unwrap(),
            version,
            generation: if version == 1 { 0 } else { G },
            ..sample()
        }
    }

    /// A superblock to decode entries under: an origin of `origin_blocks`,
    /// commit `commit_seq`, generation `generation`, version 4, epoch 0.
    fn under(origin_blocks: u64, commit_seq: u64, generation: u32) -> Superblock {
        Superblock {
            origin_sectors: origin_blocks * 8,
            commit_seq,
            generation,
            ..sample()
        }
    }

    const G: u32 = 0xa5a5_0001;

    #[test]
    fn superblock_roundtrip_and_damage() {
        let sb = sample();
        let raw = encode_sb(&sb);
        assert_eq!(&raw[..8], b"TIERCACH");
        let (st, got) = decode_sb(&raw);
        assert_eq!(st, SbState::Ok);
        assert_eq!(got.unwrap(), sb);
        let mut bad = raw;
        bad[100] ^= 1;
        assert_eq!(decode_sb(&bad).0, SbState::BadCsum);
        assert_eq!(decode_sb(&[0u8; 512]).0, SbState::Blank);
        assert_eq!(decode_sb(&[]).0, SbState::Blank);
        assert!(SbState::BadCsum.describe().contains("checksum"));
    }

    #[test]
    fn superblock_flags() {
        let failed = Superblock {
            flags: SB_FAILED,
            ..sample()
        };
        let raw = encode_sb(&failed);
        let f = std::mem::offset_of!(ffi::tc_disk_sb, flags);
        assert_eq!(f, 28);
        assert_eq!(&raw[f..f + 4], &1u32.to_le_bytes());
        let (st, got) = decode_sb(&raw);
        assert_eq!(st, SbState::Ok);
        let got = got.unwrap();
        assert!(got.failed());
        assert_eq!(got, failed);
        assert!(!sample().failed());
        // A bit the decoder does not know, alone or beside FAILED: refused.
        for flags in [2u32, 3, 0x8000_0000] {
            let raw = encode_sb(&Superblock { flags, ..sample() });
            assert_eq!(decode_sb(&raw).0, SbState::BadFields, "flags {flags:#x}");
        }
    }

    #[test]
    fn marking_a_superblock_failed() {
        let mut area = vec![0u8; (SB_SECTORS * 512) as usize];
        area[..SB_BYTES].copy_from_slice(&encode_sb(&sample()));
        area[SB_BYTES + 7] = 0x5a; // beyond the superblock: kept
        let new = sb_marked_failed(&area, "dev").unwrap().unwrap();
        assert_eq!(new.len(), area.len());
        assert_eq!(new[SB_BYTES..], area[SB_BYTES..]);
        let (st, got) = decode_sb(&new);
        assert_eq!(st, SbState::Ok);
        assert_eq!(
            got.unwrap(),
            Superblock {
                flags: SB_FAILED,
                ..sample()
            }
        );
        // Byte for byte what the C encoder writes for the marked superblock.
        assert_eq!(
            new[..SB_BYTES],
            encode_sb(&Superblock {
                flags: SB_FAILED,
                ..sample()
            })
        );
        assert_eq!(sb_marked_failed(&new, "dev").unwrap(), None);

        // Version 1: written as version 3, generation 0, epoch 0.
        let v1 = sample_v(1);
        let new = sb_marked_failed(&encode_sb(&v1), "dev").unwrap().unwrap();
        let got = decode_sb(&new).1.unwrap();
        assert_eq!(
            (got.version, got.generation, got.epoch, got.flags),
            (3, 0, 0, SB_FAILED)
        );
        assert_eq!((got.layout, got.commit_seq), (v1.layout, v1.commit_seq));

        // Version 3 stays version 3 (no room for a summary), version 4
        // stays version 4: the layout is kept.
        for v in [VERSION_V3, VERSION] {
            let sb = sample_v(v);
            let new = sb_marked_failed(&encode_sb(&sb), "dev").unwrap().unwrap();
            let got = decode_sb(&new).1.unwrap();
            assert_eq!(
                got,
                Superblock {
                    flags: SB_FAILED,
                    ..sb
                }
            );
        }

        // Nothing to mark: refused.
        let e = sb_marked_failed(&[0u8; 4096], "dev").unwrap_err();
        assert_eq!(e.kind, Kind::NoSuperblock);
        let mut bad = area.clone();
        bad[100] ^= 1;
        let e = sb_marked_failed(&bad, "dev").unwrap_err();
        assert_eq!(e.kind, Kind::BadSuperblock);
        assert_eq!(e.msg, "dev: superblock checksum mismatch (torn or corrupt)");
    }

    #[test]
    fn mark_failed_only_the_cache_wanted() {
        let path = std::env::temp_dir().join(format!("tiercache-want-{}.img", std::process::id()));
        let p = path.to_string_lossy().into_owned();
        let write = |img: &[u8]| std::fs::write(&path, img).unwrap();
        let mark = |want: &MarkWant| {
            let dev = Dev::open(&p, Access::WriteExclusive).unwrap();
            mark_failed(&dev, want)
        };
        let failed_now = || {
            decode_sb(&std::fs::read(&path).unwrap())
                .1
                .unwrap()
                .failed()
        };
        let sb = sample();
        let img = build_image(&sb, 4096, &[(3, 77, true, 5)], |_| 0xab);
        let want = |uuid: &str, origin: u64| MarkWant {
            devno: None,
            uuid: Some(uuid.into()),
            origin_sectors: Some(origin),
        };

        // Another device's cache: refused (exit 4), nothing written.
        write(&img);
        let e = mark(&want("TIERCACHE-u", 8192)).unwrap_err();
        assert_eq!((e.kind, e.kind.exit_code()), (Kind::Busy, 4));
        assert_eq!(
            e.msg,
            format!("{p}: its superblock is the cache of another device (uuid TIERCACHE-t, not TIERCACHE-u); not marked")
        );
        let e = mark(&want("TIERCACHE-t", 8000)).unwrap_err();
        assert!(
            e.msg
                .contains("(an origin of 8192 sectors, not 8000); not marked"),
            "{}",
            e.msg
        );
        assert!(!failed_now());
        assert_eq!(std::fs::read(&path).unwrap(), img);

        // A device number is wanted: a regular file has none (exit 3).
        let e = mark(&MarkWant {
            devno: Some((8, 32)),
            ..MarkWant::default()
        })
        .unwrap_err();
        assert_eq!(e.kind, Kind::NotFound);
        assert_eq!(
            e.msg,
            format!("{p}: not the cache device: it is not a block device, the cache device was 8:32; not marked")
        );
        assert!(!failed_now());

        // The module's rule: an empty uuid on either side matches.
        assert!(mark(&want("", 8192)).unwrap());
        assert!(failed_now());
        let anyone = Superblock {
            uuid: String::new(),
            ..sample()
        };
        write(&build_image(&anyone, 4096, &[], |_| 0));
        assert!(mark(&want("TIERCACHE-u", 8192)).unwrap());
        // The right one; then marked already: nothing written.
        write(&img);
        assert!(mark(&want("TIERCACHE-t", 8192)).unwrap());
        assert!(!mark(&want("TIERCACHE-t", 8192)).unwrap());

        // Blank (11) and corrupt (12) superblocks: nothing to mark.
        write(&vec![0u8; 4096 * 512]);
        let e = mark(&want("TIERCACHE-t", 8192)).unwrap_err();
        assert_eq!(e.kind, Kind::NoSuperblock);
        let mut bad = img.clone();
        bad[100] ^= 1;
        write(&bad);
        let e = mark(&want("TIERCACHE-t", 8192)).unwrap_err();
        assert_eq!(e.kind, Kind::BadSuperblock);
        assert_eq!(std::fs::read(&path).unwrap(), bad);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn mark_failed_on_an_image_file() {
        let sb = sample();
        let img = build_image(&sb, 4096, &[(3, 77, true, 5)], |_| 0xab);
        let path = std::env::temp_dir().join(format!("tiercache-mark-{}.img", std::process::id()));
        std::fs::write(&path, &img).unwrap();
        let p = path.to_string_lossy().into_owned();
        let dev = Dev::open(&p, Access::WriteExclusive).unwrap();
        assert_eq!(dev.devno(), None, "a regular file");
        assert!(mark_failed(&dev, &MarkWant::default()).unwrap());
        assert!(
            !mark_failed(&dev, &MarkWant::default()).unwrap(),
            "marked already"
        );
        drop(dev);
        let after = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(decode_sb(&after).1.unwrap().failed());
        assert_eq!(after.len(), img.len());
        assert!(
            after[SB_BYTES..] == img[SB_BYTES..],
            "only the superblock changed"
        );
    }

    #[test]
    fn entries_decode_through_c() {
        let e = decode_entry(&encode_entry(3, 77, true, 5, G, 0), 3, &under(100, 9, G));
        assert_eq!(e.state, EntryState::Dirty);
        assert_eq!((e.block, e.seq, e.dirty), (Some(77), Some(5), Some(true)));
        // Uncommitted: whether it is dirty is decoded too (the summary
        // rule covers uncommitted dirty entries).
        let e = decode_entry(&encode_entry(3, 77, true, 10, G, 0), 3, &under(100, 9, G));
        assert_eq!((e.state, e.dirty), (EntryState::Uncommitted, Some(true)));
        let e = decode_entry(&encode_entry(3, 77, false, 10, G, 0), 3, &under(100, 9, G));
        assert_eq!((e.state, e.dirty), (EntryState::Uncommitted, Some(false)));
        let e = decode_entry(&encode_entry(3, 77, false, 5, G, 0), 3, &under(100, 9, G));
        assert_eq!(e.state, EntryState::Clean);
        // Another generation's entry, in its place or not: foreign (empty).
        let e = decode_entry(
            &encode_entry(3, 77, true, 5, G - 1, 0),
            3,
            &under(100, 9, G),
        );
        assert_eq!((e.state, e.block), (EntryState::Foreign, None));
        assert!(!e.state.is_corrupt());
        assert!(e.state.describe().starts_with("foreign"));
        let e = decode_entry(
            &encode_entry(3, 77, true, 5, G - 1, 0),
            4,
            &under(100, 9, G),
        );
        assert_eq!((e.state, e.block), (EntryState::Foreign, None));
        // This generation's, another slot's: misplaced, corrupt.
        let e = decode_entry(&encode_entry(3, 77, true, 5, G, 0), 4, &under(100, 9, G));
        assert_eq!((e.state, e.block), (EntryState::BadSlot, None));
        assert!(e.state.is_corrupt());
        assert_eq!(e.state.as_str(), "bad_slot");
        assert!(e.state.describe().contains("misdirected"));
        // Ours with a flipped bit in the generation or slot word: corrupt.
        for byte in [16, 19, 28, 31] {
            let mut raw = encode_entry(3, 77, true, 5, G, 0);
            raw[byte] ^= 0x10;
            assert_eq!(
                decode_entry(&raw, 3, &under(100, 9, G)).state,
                EntryState::BadCsum
            );
        }
        let e = decode_entry(&encode_entry(3, 100, true, 5, G, 0), 3, &under(100, 9, G));
        assert_eq!((e.state, e.block), (EntryState::BadBlock, Some(100)));
        assert_eq!(
            decode_entry(&encode_empty_entry(), 3, &under(100, 9, G)).state,
            EntryState::Empty
        );
        let mut raw = encode_entry(3, 77, true, 5, G, 0);
        raw[0] ^= 0x80;
        let e = decode_entry(&raw, 3, &under(100, 9, G));
        assert_eq!(e.state, EntryState::BadCsum);
        assert!(e.state.is_corrupt());
        assert_eq!(e.state.describe(), "checksum mismatch");
    }

    #[test]
    fn layouts_of_the_versions() {
        // 4096 sectors of 4 KiB slots: 507 slots without a summary, 506
        // with its one block (in 4 metadata blocks either way).
        let v4 = layout(4096, 8).unwrap();
        assert_eq!(layout_v(4096, 8, VERSION), Some(v4));
        assert_eq!((v4.nr_slots, v4.meta_blocks), (506, 4));
        assert_eq!((v4.sum_start, v4.sum_blocks), (v4.meta_end_sector(), 1));
        assert_eq!(v4.sum_end_sector(), v4.sum_start + 8);
        assert_eq!(v4.data_start, v4.sum_end_sector());
        assert!(v4.has_summary() && v4.version() == VERSION);
        for v in [1, VERSION_V2, VERSION_V3] {
            let l = layout_v(4096, 8, v).unwrap();
            assert_eq!((l.nr_slots, l.meta_blocks), (507, 4), "version {v}");
            assert_eq!((l.sum_start, l.sum_blocks, l.sum_end_sector()), (0, 0, 0));
            assert_eq!(l.data_start, l.meta_end_sector());
            assert!(!l.has_summary() && l.version() == VERSION_V3);
        }
        // The data area starts on a block boundary after the summary.
        let big = layout(1 << 21, 1024).unwrap();
        assert_eq!(big.data_start % 1024, 0);
        assert!(big.data_start >= big.sum_end_sector());
        assert!(big.data_start - big.sum_end_sector() < 1024);
        assert_eq!(layout_v(16, 8, VERSION_V3), None);
    }

    #[test]
    fn summary_blocks_decode_through_c() {
        let meta_blocks = SUM_BITS + 10;
        let raw = encode_sum(0, G, &[0, 5, SUM_BITS - 1]);
        let b = SumBlock::decode(&raw, 0, G);
        assert_eq!(b.state, SumState::Ok);
        assert!(b.marks(0) && b.marks(5) && b.marks(SUM_BITS - 1) && !b.marks(1));
        assert_eq!(
            (b.covers(meta_blocks), b.marked(meta_blocks)),
            (SUM_BITS, 3)
        );
        // Another generation's, or all zero: bad (a format writes every
        // summary block), all marked.
        let old = SumBlock::decode(&raw, 0, G - 1);
        assert_eq!((old.state, old.marks(1)), (SumState::Bad, true));
        let zero = SumBlock::decode(&[0u8; SUM_BYTES], 0, G);
        assert_eq!((zero.state, zero.marks(5)), (SumState::Bad, true));
        assert_eq!(zero.marked(meta_blocks), SUM_BITS);
        assert_eq!(
            zero.state.describe(),
            "torn, damaged or not of this format (read as all set)"
        );
        // Ours in the wrong place, or with a bit flipped: bad, all marked.
        assert_eq!(SumBlock::decode(&raw, 1, G).state, SumState::Bad);
        let mut torn = raw.clone();
        torn[100] ^= 4;
        let b = SumBlock::decode(&torn, 0, G);
        assert_eq!((b.state, b.marks(1)), (SumState::Bad, true));
        assert_eq!(b.marked(meta_blocks), SUM_BITS);
        assert_eq!(b.state.describe(), zero.state.describe());
        // The second block covers the rest; bits are numbered within it.
        let raw = encode_sum(1, G, &[SUM_BITS + 9]);
        let b = SumBlock::decode(&raw, 1, G);
        assert_eq!((b.first_mblock(), b.covers(meta_blocks)), (SUM_BITS, 10));
        assert!(b.marks(SUM_BITS + 9) && !b.marks(SUM_BITS));
        assert_eq!(b.marked(meta_blocks), 1);
    }

    #[test]
    fn summary_of_an_image() {
        // Dirty entries in metadata blocks 0 and 2 (slot 300, uncommitted),
        // a clean one in block 1: blocks 0 and 2 are marked, and they are
        // the blocks the summary rule covers.
        let sb = sample();
        let per = entries_per_mblock();
        let img = build_image(
            &sb,
            4096,
            &[
                (3, 77, true, 5),
                (per + 1, 78, false, 5),
                (2 * per + 44, 79, true, 10),
            ],
            |_| 0xab,
        );
        let m = MemImage {
            name: "img".into(),
            data: img,
        };
        let sum = read_summary(&m, &sb).unwrap().unwrap();
        assert_eq!((sum.meta_blocks, sum.blocks.len()), (4, 1));
        assert_eq!(sum.blocks[0].state, SumState::Ok);
        assert_eq!(sum.marked(), 2);
        assert!(sum.marks(0) && !sum.marks(1) && sum.marks(2) && !sum.marks(3));
        let s = survey(&m, &sb).unwrap();
        assert_eq!(
            s.dirty_mblocks,
            vec![
                DirtyMblock {
                    mblock: 0,
                    first_slot: 3,
                    entries: 1
                },
                DirtyMblock {
                    mblock: 2,
                    first_slot: 2 * per + 44,
                    entries: 1
                },
            ]
        );
        assert!(sum.unmarked(&s.dirty_mblocks).is_empty());
        // Block 2's bit cleared: it is unmarked.
        let mut m2 = m.clone();
        write_summary(&mut m2.data, &sb, &[0]);
        let sum = read_summary(&m2, &sb).unwrap().unwrap();
        assert_eq!(sum.unmarked(&s.dirty_mblocks), vec![s.dirty_mblocks[1]]);
        // Version 3: no summary to read.
        assert!(read_summary(&m, &sample_v(VERSION_V3)).unwrap().is_none());
    }

    #[test]
    fn version_1_superblock_reads_as_generation_0() {
        let v1 = sample_v(1);
        let raw = encode_sb(&v1);
        assert_eq!(&raw[8..12], &1u32.to_le_bytes());
        let (st, got) = decode_sb(&raw);
        assert_eq!(st, SbState::Ok);
        let got = got.unwrap();
        assert_eq!((got.version, got.generation), (1, 0));
        assert_eq!(got, v1);
        // A version 1 entry (its last word reserved, zero) is generation 0's.
        let e = decode_entry(&encode_entry(3, 77, true, 5, 0, 0), 3, &got);
        assert_eq!(e.state, EntryState::Dirty);
        assert_eq!(&encode_entry(3, 77, true, 5, 0, 0)[28..], &[0u8; 4]);
        // Version 1 with a non-zero generation word: a bad field there.
        let mut bad = encode_sb(&sample());
        let v = std::mem::offset_of!(ffi::tc_disk_sb, version);
        let c = std::mem::offset_of!(ffi::tc_disk_sb, csum);
        bad[v..v + 4].copy_from_slice(&1u32.to_le_bytes());
        bad[c..c + 4].fill(0);
        let sum = crc(&bad);
        bad[c..c + 4].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(decode_sb(&bad).0, SbState::BadFields);
    }

    #[test]
    fn survey_counts_and_duplicates() {
        let sb = sample();
        let img = build_image(
            &sb,
            4096,
            &[
                (0, 5, true, 9),
                (1, 6, false, 3),
                (2, 5, true, 8),
                (3, 7, true, 10),
                (200, 1, true, 1),
            ],
            |b| b as u8,
        );
        let mut m = MemImage {
            name: "img".into(),
            data: img,
        };
        // Corrupt slot 200's entry.
        let off = entry_offset(&sb.layout, 200) as usize;
        m.data[off + 9] ^= 0xff;
        let r = read_superblock(&m).unwrap();
        assert_eq!(r.state, SbState::Ok);
        assert!(r.problem("img").is_none());
        let s = survey(&m, r.sb.as_ref().unwrap()).unwrap();
        assert_eq!(
            s.counts,
            Counts {
                empty: sb.layout.nr_slots - 5,
                foreign: 0,
                clean: 1,
                dirty: 2,
                uncommitted: 1,
                corrupt: 1
            }
        );
        assert_eq!(s.corrupt[0].slot, 200);
        assert_eq!(s.corrupt[0].state, EntryState::BadCsum);
        assert_eq!(
            s.duplicates,
            vec![Duplicate {
                block: 5,
                epoch: 0,
                slots: vec![0, 2],
                seqs: vec![9, 8]
            }]
        );
        assert!(s.versions_to_write().is_empty());
    }

    #[test]
    fn survey_of_garbage_and_older_generations() {
        // The entry area full of garbage, two entries of this generation
        // and one of the previous: the garbage and the old entry are
        // foreign (free slots), nothing is corrupt.
        let sb = sample();
        let l = sb.layout;
        let mut img = build_image(&sb, 4096, &[], |_| 0);
        let area = (l.meta_start * 512) as usize..(l.meta_end_sector() * 512) as usize;
        garbage(&mut img[area], 0x9e37_79b9_7f4a_7c15);
        let put = |img: &mut Vec<u8>, slot: u64, raw: [u8; ENTRY_BYTES]| {
            let o = entry_offset(&l, slot) as usize;
            img[o..o + ENTRY_BYTES].copy_from_slice(&raw);
        };
        put(&mut img, 4, encode_entry(4, 40, true, 9, G, 0));
        put(&mut img, 5, encode_entry(5, 41, false, 2, G, 0));
        put(&mut img, 6, encode_entry(6, 42, true, 9, G - 1, 0));
        put(&mut img, 7, encode_empty_entry());
        let m = MemImage {
            name: "img".into(),
            data: img,
        };
        let s = survey(&m, &sb).unwrap();
        assert_eq!(
            s.counts,
            Counts {
                empty: 1,
                foreign: l.nr_slots - 3,
                clean: 1,
                dirty: 1,
                uncommitted: 0,
                corrupt: 0
            }
        );
        assert_eq!(s.counts.used(), 2);
        assert_eq!(
            s.dirty,
            vec![DirtyRef {
                block: 40,
                slot: 4,
                seq: 9,
                epoch: 0
            }]
        );
        // Under the previous generation, slot 6 is its dirty block and
        // this generation's entries are foreign.
        let old = Superblock {
            generation: G - 1,
            ..sb.clone()
        };
        let s = survey(&m, &old).unwrap();
        assert_eq!((s.counts.dirty, s.counts.clean), (1, 0));
        assert_eq!(s.dirty[0].slot, 6);
    }

    #[test]
    fn disk_epoch_through_c() {
        for (sbe, e, want) in [
            (0u64, 0u16, 0u64),
            (0, 0xffff, 0xffff),
            (0xfffe, 0xffff, 0xffff),
            (0xfffe, 0, 0x1_0000),
            (0xfffe, 0xfffd, 0x1_fffd),
            (0x1_0001, 0, 0x2_0000),
            (u64::MAX, 0xffff, u64::MAX),
            (u64::MAX, 0, 0),
        ] {
            assert_eq!(disk_epoch(sbe, e), want, "{sbe:#x} {e:#x}");
        }
    }

    #[test]
    fn entry_epochs_through_c() {
        // Superblock epoch 0xfff0: the entries' 16 bits wrap past it.
        let sb = Superblock {
            epoch: 0xfff0,
            ..sample()
        };
        assert_eq!(decode_sb(&encode_sb(&sb)).1.unwrap(), sb);
        let f = std::mem::offset_of!(ffi::tc_disk_entry, flags);
        for epoch in [0xfff0u64, 0xffff, 0x1_0000, 0x1_0005, 0x1_ffef] {
            let raw = encode_entry(3, 77, true, 5, G, epoch);
            let flags = u32::from_le_bytes(raw[f..f + 4].try_into().unwrap());
            assert_eq!(flags, 3 | ((epoch as u32 & 0xffff) << 16));
            let e = decode_entry(&raw, 3, &sb);
            assert_eq!((e.state, e.epoch), (EntryState::Dirty, Some(epoch)));
            // Uncommitted and beyond the origin: the epoch is decoded too.
            let e = decode_entry(&encode_entry(3, 77, true, 10, G, epoch), 3, &sb);
            assert_eq!((e.state, e.epoch), (EntryState::Uncommitted, Some(epoch)));
            let e = decode_entry(&encode_entry(3, 1024, true, 5, G, epoch), 3, &sb);
            assert_eq!((e.state, e.epoch), (EntryState::BadBlock, Some(epoch)));
        }
        // A clean entry has no epoch, whatever it is given.
        let raw = encode_entry(3, 77, false, 5, G, 0x1234);
        assert_eq!(raw, encode_entry(3, 77, false, 5, G, 0));
        let e = decode_entry(&raw, 3, &sb);
        assert_eq!((e.state, e.epoch), (EntryState::Clean, None));
        // Epoch bits in a version 2 entry, or in a clean one: invalid flags.
        let v2 = Superblock {
            version: VERSION_V2,
            ..sample()
        };
        let e = decode_entry(&encode_entry(3, 77, true, 5, G, 1), 3, &v2);
        assert_eq!((e.state, e.block), (EntryState::BadFlags, None));
        assert!(e.state.is_corrupt());
        let e = decode_entry(&encode_entry(3, 77, true, 5, G, 0), 3, &v2);
        assert_eq!((e.state, e.epoch), (EntryState::Dirty, Some(0)));
        let mut raw = encode_entry(3, 77, false, 5, G, 0);
        raw[f + 2] = 1;
        let c = std::mem::offset_of!(ffi::tc_disk_entry, csum);
        raw[c..c + 4].fill(0);
        let sum = crc(&raw);
        raw[c..c + 4].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(decode_entry(&raw, 3, &sb).state, EntryState::BadFlags);
    }

    #[test]
    fn version_2_superblock_reads_as_epoch_0() {
        let v2 = sample_v(VERSION_V2);
        let raw = encode_sb(&v2);
        assert_eq!(&raw[8..12], &2u32.to_le_bytes());
        let got = decode_sb(&raw).1.unwrap();
        assert_eq!(got, v2);
        assert!(!got.has_epochs() && sample().has_epochs());
        // An epoch in version 2 (its words were reserved): a bad field.
        let bad = encode_sb(&Superblock { epoch: 7, ..v2 });
        assert_eq!(decode_sb(&bad).0, SbState::BadFields);
        // Marked failed: written as version 3, epoch 0.
        let new = sb_marked_failed(&raw, "dev").unwrap().unwrap();
        let got = decode_sb(&new).1.unwrap();
        assert_eq!((got.version, got.epoch, got.flags), (3, 0, SB_FAILED));
    }

    #[test]
    fn survey_version_chains() {
        // Block 5 in epochs 100, 101 and 103; block 6 twice in epoch 101
        // (a duplicate); block 7 once; the superblock's epoch 100.
        let sb = Superblock {
            epoch: 100,
            ..sample()
        };
        let img = build_image_epochs(
            &sb,
            4096,
            &[
                (0, 5, true, 9, 103),
                (1, 5, true, 8, 100),
                (2, 6, true, 9, 101),
                (3, 7, true, 9, 102),
                (4, 5, true, 9, 101),
                (5, 6, true, 7, 101),
                (6, 6, true, 7, 100),
                (7, 8, false, 9, 0),
            ],
            |b, e| (b + e) as u8,
        );
        let m = MemImage {
            name: "img".into(),
            data: img,
        };
        let s = survey(&m, &sb).unwrap();
        assert_eq!(
            (s.counts.dirty, s.counts.clean, s.counts.corrupt),
            (7, 1, 0)
        );
        assert_eq!(
            s.duplicates,
            vec![Duplicate {
                block: 6,
                epoch: 101,
                slots: vec![2, 5],
                seqs: vec![9, 7]
            }]
        );
        assert_eq!(
            s.epochs(),
            vec![
                EpochCount {
                    epoch: 100,
                    dirty: 2
                },
                EpochCount {
                    epoch: 101,
                    dirty: 3
                },
                EpochCount {
                    epoch: 102,
                    dirty: 1
                },
                EpochCount {
                    epoch: 103,
                    dirty: 1
                },
            ]
        );
        assert_eq!(s.versioned_blocks(), 2, "blocks 5 and 6");
        // Oldest epoch first, by block within one; block 6 left out.
        let w: Vec<(u64, u64, u64)> = s
            .versions_to_write()
            .iter()
            .map(|d| (d.epoch, d.block, d.slot))
            .collect();
        assert_eq!(w, vec![(100, 5, 1), (101, 5, 4), (102, 7, 3), (103, 5, 0)]);

        // The same entries under version 2: epoch bits are invalid flags,
        // and the entries of epoch 0 mod 2^16 are all of epoch 0.
        let v2 = Superblock {
            version: VERSION_V2,
            epoch: 0,
            ..sb
        };
        let mut m2 = m.clone();
        m2.data[..SB_BYTES].copy_from_slice(&encode_sb(&v2));
        let s = survey(&m2, &v2).unwrap();
        assert_eq!((s.counts.dirty, s.counts.corrupt), (0, 7));
        assert!(s.corrupt.iter().all(|b| b.state == EntryState::BadFlags));
    }

    #[test]
    fn superblock_larger_than_device() {
        let sb = sample();
        let img = build_image(&sb, 4096, &[], |_| 0);
        let m = MemImage {
            name: "img".into(),
            data: img[..2048 * 512].to_vec(),
        };
        let r = read_superblock(&m).unwrap();
        let e = r.problem("img").unwrap();
        assert_eq!(e.kind, Kind::BadSuperblock);
        assert!(e.msg.contains("but the device has 2048"), "{}", e.msg);
        assert!(r.entries_readable());
    }
}
