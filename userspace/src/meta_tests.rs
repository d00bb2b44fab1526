// SPDX-License-Identifier: GPL-2.0-only
//! check, dump and writeback on image files built with the C encoder.

use super::*;
use crate::disk::{build_image, ffi, garbage};
use std::path::PathBuf;

/// A directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("tiercache-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str, data: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, data).unwrap();
        p.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const CACHE_SECTORS: u64 = 8192; // 4 MiB
const ORIGIN_SECTORS: u64 = 16384; // 8 MiB, 2048 blocks of 4 KiB

/// The format generation of the test images.
const G: u32 = 0x5eed_0007;

fn sb(commit_seq: u64) -> Superblock {
    Superblock {
        layout: disk::layout(CACHE_SECTORS, 8).unwrap(),
        commit_seq,
        origin_sectors: ORIGIN_SECTORS,
        uuid: "TIERCACHE-t".into(),
        version: disk::VERSION,
        generation: G,
        flags: 0,
        epoch: 0,
    }
}

/// `sb(commit_seq)` of format `version`, in the layout of that version
/// (versions 1 to 3: no summary; 1: generation 0).
fn sb_v(commit_seq: u64, version: u32) -> Superblock {
    Superblock {
        layout: disk::layout_v(CACHE_SECTORS, 8, version).unwrap(),
        version,
        generation: if version == 1 { 0 } else { G },
        ..sb(commit_seq)
    }
}

/// Slot data: every byte is the origin block number + 1 (mod 256), so a
/// written block can be told from the origin's own content (0xee).
fn fill(block: u64) -> u8 {
    (block as u8).wrapping_add(1)
}

/// (slot, block, dirty, seq): dirty 10-12 (adjacent, in scattered slots),
/// dirty 40, clean 41, dirty 500 uncommitted (seq above the commit).
fn entries() -> Vec<(u64, u64, bool, u64)> {
    vec![
        (0, 11, true, 5),
        (1, 12, true, 6),
        (7, 10, true, 7),
        (8, 40, true, 7),
        (9, 41, false, 7),
        (10, 500, true, 8),
    ]
}

fn image() -> Vec<u8> {
    build_image(&sb(7), CACHE_SECTORS, &entries(), fill)
}

fn entry_off(slot: u64) -> usize {
    disk::entry_offset(&sb(7).layout, slot) as usize
}

fn run_check(path: &str) -> (String, std::result::Result<(), Error>) {
    let mut out = vec![];
    let mut err = vec![];
    let r = check(path, false, &mut out, &mut err);
    (String::from_utf8(out).unwrap(), r)
}

fn check_kind(data: &[u8]) -> (Option<Kind>, String) {
    let d = TempDir::new("kind");
    let p = d.file("cache.img", data);
    let (out, r) = run_check(&p);
    (r.err().map(|e| e.kind), out)
}

#[test]
fn check_consistent_image() {
    let d = TempDir::new("ok");
    let p = d.file("cache.img", &image());
    let (out, r) = run_check(&p);
    r.unwrap();
    for needle in [
        "tiercache metadata, format version 4\n",
        "uuid:        TIERCACHE-t",
        "origin:      8 MiB (16384 sectors, 2048 blocks)",
        "commit seq:  7",
        "generation:  0x5eed0007",
        "slots used:  6 of",
        "4 dirty (16 KiB), 1 clean, 1 uncommitted (ignored), 0 corrupt",
        "free slots:  ",
        " empty, 0 foreign (of another format generation, or leftover bytes: free, not errors)",
        // Slots 0-10 are all in metadata block 0 (dirty 500 uncommitted too).
        "  summary:     1 of 8 metadata blocks marked, 1 with dirty entries (1 summary block from sector 72)\n",
        "result:      consistent",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    // --json
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["result"], "ok");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["counts"]["dirty"], 4);
    assert_eq!(v["counts"]["uncommitted"], 1);
    assert_eq!(v["superblock"]["commit_seq"], 7);
    assert_eq!(v["superblock"]["uuid"], "TIERCACHE-t");
    assert_eq!(v["superblock"]["version"], 4);
    assert_eq!(v["superblock"]["generation"], G);
    assert_eq!(v["counts"]["foreign"], 0);
    assert_eq!(v["superblock"]["layout"]["sum_start"], 72);
    assert_eq!(v["superblock"]["layout"]["sum_blocks"], 1);
    assert_eq!(
        v["summary"],
        serde_json::json!({"start": 72, "blocks": 1, "meta_blocks": 8, "marked": 1,
            "dirty_meta_blocks": 1, "damaged": [], "unmarked": []})
    );
}

#[test]
fn check_exit_codes_per_corruption() {
    // Cannot read: no such file.
    let mut o = vec![];
    let e = check("/nonexistent/cache.img", true, &mut o, &mut vec![]).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Unreadable, 10));
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["result"], "unreadable");

    // Never formatted.
    let (k, _) = check_kind(&vec![0u8; 1 << 20]);
    assert_eq!(k, Some(Kind::NoSuperblock));
    assert_eq!(Kind::NoSuperblock.exit_code(), 11);
    // A file too small for a superblock is not a cache either.
    assert_eq!(check_kind(&[]).0, Some(Kind::NoSuperblock));

    // A flipped superblock byte: checksum.
    let mut img = image();
    img[100] ^= 0x01;
    let d = TempDir::new("sb");
    let p = d.file("cache.img", &img);
    let (_, r) = run_check(&p);
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::BadSuperblock, 12));
    assert!(e.msg.contains("superblock checksum mismatch"), "{}", e.msg);
    // A flipped magic byte reads as no superblock at all.
    let mut img = image();
    img[2] ^= 0x01;
    assert_eq!(check_kind(&img).0, Some(Kind::NoSuperblock));
    // An unknown version with a valid checksum.
    let mut img = image();
    let v = std::mem::offset_of!(ffi::tc_disk_sb, version);
    let c = std::mem::offset_of!(ffi::tc_disk_sb, csum);
    img[v..v + 4].copy_from_slice(&5u32.to_le_bytes());
    img[c..c + 4].fill(0);
    let crc = disk::crc(&img[..disk::SB_BYTES]);
    img[c..c + 4].copy_from_slice(&crc.to_le_bytes());
    let (k, _) = check_kind(&img);
    assert_eq!(k, Some(Kind::BadSuperblock));
    // A superblock describing more than the device.
    let img = image();
    assert_eq!(check_kind(&img[..1 << 20]).0, Some(Kind::BadSuperblock));

    // A flipped entry byte: exactly that slot is reported, with the reason.
    let mut img = image();
    img[entry_off(8) + 3] ^= 0x10;
    let d = TempDir::new("entry");
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::BadEntries, 13));
    assert_eq!(e.msg, format!("{p}: 1 corrupt entry (slot 8)"));
    assert!(
        out.contains("corrupt:     slot 8: checksum mismatch (entry "),
        "{out}"
    );
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap_err();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["result"], "bad_entries");
    assert_eq!(v["exit_code"], 13);
    assert_eq!(v["corrupt"][0]["slot"], 8);
    assert_eq!(v["corrupt"][0]["state"], "bad_csum");
    assert_eq!(v["corrupt"][0]["reason"], "checksum mismatch");

    // An entry of this generation in the wrong slot (valid checksum): a
    // misdirected write, corrupt.
    let mut img = image();
    let o3 = entry_off(3);
    img[o3..o3 + 32].copy_from_slice(&disk::encode_entry(4, 1, true, 1, G, 0));
    let d = TempDir::new("slot");
    let (out, r) = run_check(&d.file("cache.img", &img));
    assert_eq!(r.unwrap_err().kind, Kind::BadEntries);
    assert!(
        out.contains("corrupt:     slot 3: slot number does not match its position"),
        "{out}"
    );
    // Another generation's entry in the wrong slot: foreign, not an error.
    img[o3..o3 + 32].copy_from_slice(&disk::encode_entry(4, 1, true, 1, G - 1, 0));
    let (out, r) = run_check(&d.file("cache2.img", &img));
    r.unwrap();
    assert!(out.contains(" 1 foreign (of another"), "{out}");
    // A flipped bit in the generation or slot word of a dirty entry of
    // this generation: corrupt (the checksum holds with the word put back).
    for byte in [16, 28] {
        let mut img = image();
        img[entry_off(8) + byte] ^= 0x04;
        assert_eq!(check_kind(&img).0, Some(Kind::BadEntries));
    }
    // A corrupt entry of this generation still fails: a flipped flags bit.
    let mut img = image();
    img[entry_off(9) + 20] ^= 0x01;
    assert_eq!(check_kind(&img).0, Some(Kind::BadEntries));

    // Two committed dirty entries for one origin block.
    let mut es = entries();
    es.push((20, 40, true, 3));
    let img = build_image(&sb(7), CACHE_SECTORS, &es, fill);
    let d = TempDir::new("dup");
    let (out, r) = run_check(&d.file("cache.img", &img));
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::DuplicateDirty, 14));
    assert!(
        e.msg.ends_with(
            ": 1 origin block is dirty in more than one slot of one epoch (block 40 in epoch 0)"
        ),
        "{}",
        e.msg
    );
    assert!(
        out.contains(
            "origin block 40 is dirty in slot 8 (seq 7), slot 20 (seq 3), all of epoch 0\n"
        ),
        "{out}"
    );

    // Both: corrupt entries take precedence.
    let mut img = img;
    img[entry_off(0)] ^= 0xff;
    assert_eq!(check_kind(&img).0, Some(Kind::BadEntries));

    // A clean duplicate of a dirty block, or an uncommitted one, is fine.
    let mut es = entries();
    es.push((20, 40, false, 3));
    es.push((21, 40, true, 9));
    let img = build_image(&sb(7), CACHE_SECTORS, &es, fill);
    assert_eq!(check_kind(&img).0, None);
}

#[test]
fn uncommitted_entry_is_ignored() {
    // The same dirty entry, committed or not, depending on commit_seq.
    let es = [(3, 100, true, 8)];
    let committed = build_image(&sb(8), CACHE_SECTORS, &es, fill);
    let pending = build_image(&sb(7), CACHE_SECTORS, &es, fill);
    let d = TempDir::new("unc");
    let mut o = vec![];
    check(&d.file("a.img", &committed), true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (
            v["counts"]["dirty"].as_u64(),
            v["counts"]["uncommitted"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let mut o = vec![];
    check(&d.file("b.img", &pending), true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (
            v["counts"]["dirty"].as_u64(),
            v["counts"]["uncommitted"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(v["dirty_bytes"], 0);
}

#[test]
fn dump_text_and_json() {
    let d = TempDir::new("dump");
    let mut img = image();
    img[entry_off(9) + 20] ^= 0x04;
    let p = d.file("cache.img", &img);
    let mut o = vec![];
    // dump shows corrupt entries; it does not fail on them.
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(t.contains("  commit_seq      7\n"), "{t}");
    assert!(t.contains("  version         4\n"), "{t}");
    assert!(t.contains("  generation      0x5eed0007\n"), "{t}");
    assert!(t.contains("  uuid            TIERCACHE-t\n"), "{t}");
    // The layout, with the summary between the entries and the data, and
    // what the summary marks.
    assert!(
        t.contains(
            "  meta_blocks     8\n  sum_start       72\n  sum_blocks      1\n  data_start      80\n"
        ),
        "{t}"
    );
    assert!(
        t.contains(
            "summary (1 block from sector 72): 1 of 8 metadata blocks marked\n  block 0 (metadata blocks 0-7): valid, 1 marked: 0\nentries"
        ),
        "{t}"
    );
    let rows: Vec<&str> = t
        .lines()
        .skip_while(|l| !l.contains("SLOT"))
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 6, "{t}");
    assert_eq!(
        rows[0].split_whitespace().collect::<Vec<_>>(),
        ["0", "11", "dirty", "5", "0"]
    );
    assert_eq!(
        rows[3].split_whitespace().collect::<Vec<_>>(),
        ["8", "40", "dirty", "7", "0"]
    );
    assert!(
        rows[4].contains("bad_csum") && rows[4].contains("checksum mismatch"),
        "{}",
        rows[4]
    );
    assert!(rows[5].contains("uncommitted") && rows[5].contains("ignored: newer than commit 7"));

    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["superblock"]["magic"], "TIERCACH");
    assert_eq!(v["superblock"]["generation"], G);
    assert_eq!(v["superblock"]["nr_slots"], sb(7).layout.nr_slots);
    assert_eq!(
        (
            &v["superblock"]["sum_start"],
            &v["superblock"]["sum_blocks"]
        ),
        (&serde_json::json!(72), &serde_json::json!(1))
    );
    assert_eq!(
        v["summary"],
        serde_json::json!({"meta_blocks": 8, "marked": 1, "blocks": [
            {"index": 0, "state": "ok", "meta_blocks": 8, "marked": 1, "runs": [[0, 0]]}]})
    );
    let es = v["entries"].as_array().unwrap();
    assert_eq!(es.len(), 6);
    assert_eq!(es[1]["slot"], 1);
    assert_eq!(es[1]["block"], 12);
    assert_eq!(es[1]["state"], "dirty");
    assert_eq!(es[4]["state"], "bad_csum");
    assert_eq!(es[4]["raw"].as_str().unwrap().len(), 64);

    let mut o = vec![];
    dump(&p, true, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        v["entries"].as_array().unwrap().len() as u64,
        sb(7).layout.nr_slots
    );

    // A blank device: the state, and exit 11.
    let p = d.file("blank.img", &vec![0u8; 65536]);
    let mut o = vec![];
    let e = dump(&p, true, false, &mut o, &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::NoSuperblock);
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["superblock_state"], "blank");
}

fn origin_image() -> Vec<u8> {
    vec![0xee; (ORIGIN_SECTORS * 512) as usize]
}

#[test]
fn writeback_onto_a_file_origin() {
    let d = TempDir::new("wb");
    let cache = d.file("cache.img", &image());
    let origin = d.file("origin.img", &origin_image());
    let mut out = vec![];
    let sum = writeback(&cache, &origin, false, false, &mut out, &mut vec![]).unwrap();
    assert_eq!(
        sum,
        WritebackSummary {
            blocks: 4,
            origin_blocks: 4,
            writes: 2, // 10-12 merged, 40 alone
            bytes: 16384,
            epochs: 1,
            skipped_corrupt: 0,
            skipped_duplicate: 0
        }
    );
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("wrote 4 dirty blocks (16 KiB) from") && out.contains("in 2 writes"),
        "{out}"
    );

    // Byte for byte: blocks 10, 11, 12, 40 hold the slots' data, the rest
    // (the clean block 41, the uncommitted 500) is untouched.
    let mut want = origin_image();
    for b in [10u64, 11, 12, 40] {
        let o = (b * 4096) as usize;
        want[o..o + 4096].fill(fill(b));
    }
    let got = std::fs::read(&origin).unwrap();
    assert!(got == want, "origin content differs");

    // The entries are clean now, with their seq, and a second run has
    // nothing to do.
    let cimg = std::fs::read(&cache).unwrap();
    let e = disk::decode_entry(&cimg[entry_off(7)..entry_off(7) + 32], 7, &sb(7));
    assert_eq!(
        (e.state, e.block, e.seq),
        (EntryState::Clean, Some(10), Some(7))
    );
    let mut o = vec![];
    check(&cache, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["counts"]["dirty"], 0);
    assert_eq!(v["counts"]["clean"], 5);
    assert_eq!(v["counts"]["uncommitted"], 1);
    let mut out = vec![];
    let sum = writeback(&cache, &origin, false, false, &mut out, &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 0);
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("nothing to write back"));
    assert!(std::fs::read(&origin).unwrap() == want);
}

#[test]
fn writeback_dry_run_writes_nothing() {
    let d = TempDir::new("dry");
    let cache = d.file("cache.img", &image());
    let origin = d.file("origin.img", &origin_image());
    let mut out = vec![];
    let sum = writeback(&cache, &origin, true, false, &mut out, &mut vec![]).unwrap();
    assert_eq!((sum.blocks, sum.writes), (4, 2));
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("origin blocks 10-12 (12 KiB at sector 80) from slots 7, 0-1"),
        "{out}"
    );
    assert!(
        out.contains("origin blocks 40 (4 KiB at sector 320) from slots 8"),
        "{out}"
    );
    assert!(out.contains("dry run: nothing written"));
    assert!(std::fs::read(&origin).unwrap() == origin_image());
    assert!(std::fs::read(&cache).unwrap() == image());
}

#[test]
fn writeback_refusals_and_force() {
    let d = TempDir::new("wbref");
    let origin = d.file("origin.img", &origin_image());

    // Corrupt entry: refused, nothing written.
    let mut img = image();
    img[entry_off(8) + 1] ^= 0x01;
    let cache = d.file("cache.img", &img);
    let mut err = vec![];
    let e = writeback(&cache, &origin, false, false, &mut vec![], &mut err).unwrap_err();
    assert_eq!(e.kind, Kind::BadEntries);
    assert!(e.hint.unwrap().contains("--force"));
    assert!(String::from_utf8(err)
        .unwrap()
        .contains("slot 8: checksum mismatch"));
    assert!(std::fs::read(&origin).unwrap() == origin_image());

    // --force: the readable dirty entries are written back, the corrupt
    // one is left as it is.
    let mut err = vec![];
    let sum = writeback(&cache, &origin, false, true, &mut vec![], &mut err).unwrap();
    assert_eq!((sum.blocks, sum.skipped_corrupt), (3, 1));
    assert!(String::from_utf8(err)
        .unwrap()
        .contains("skipping 1 corrupt entry (--force)"));
    let got = std::fs::read(&origin).unwrap();
    assert_eq!(got[10 * 4096], fill(10));
    assert_eq!(got[40 * 4096], 0xee, "block 40's entry was corrupt");
    let after = std::fs::read(&cache).unwrap();
    assert_eq!(
        after[entry_off(8)..entry_off(8) + 32],
        img[entry_off(8)..entry_off(8) + 32],
        "the corrupt entry is not touched"
    );

    // Duplicates: refused; --force skips that block.
    let mut es = entries();
    es.push((20, 40, true, 3));
    let cache = d.file("dup.img", &build_image(&sb(7), CACHE_SECTORS, &es, fill));
    let origin = d.file("origin2.img", &origin_image());
    let e = writeback(&cache, &origin, false, false, &mut vec![], &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::DuplicateDirty);
    let sum = writeback(&cache, &origin, false, true, &mut vec![], &mut vec![]).unwrap();
    assert_eq!((sum.blocks, sum.skipped_duplicate), (3, 1));
    assert_eq!(std::fs::read(&origin).unwrap()[40 * 4096], 0xee);

    // Bad superblock, blank device.
    let mut img = image();
    img[40] ^= 1;
    let cache = d.file("badsb.img", &img);
    let e = writeback(&cache, &origin, false, false, &mut vec![], &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::BadSuperblock);
    let cache = d.file("blank.img", &vec![0u8; 1 << 20]);
    let e = writeback(&cache, &origin, false, false, &mut vec![], &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::NoSuperblock);

    // An origin smaller than the cache's origin.
    let cache = d.file("good.img", &image());
    let small = d.file("small.img", &vec![0u8; 1 << 20]);
    let e = writeback(&cache, &small, false, false, &mut vec![], &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    assert!(e.msg.contains("not its origin?"), "{}", e.msg);

    // The same file twice.
    let e = writeback(&cache, &cache, false, false, &mut vec![], &mut vec![]).unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    let e = writeback(
        "/nonexistent",
        &origin,
        false,
        false,
        &mut vec![],
        &mut vec![],
    )
    .unwrap_err();
    assert_eq!(e.kind, Kind::Unreadable);
}

/// `image()` with its superblock marked failed.
fn failed_image(es: &[(u64, u64, bool, u64)]) -> Vec<u8> {
    let failed = Superblock {
        flags: disk::SB_FAILED,
        ..sb(7)
    };
    build_image(&failed, CACHE_SECTORS, es, fill)
}

#[test]
fn check_reports_a_superblock_marked_failed() {
    let d = TempDir::new("failed");
    let p = d.file("cache.img", &failed_image(&entries()));
    let (out, r) = run_check(&p);
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::SbFailed, 15));
    assert!(
        e.msg.starts_with(&format!("{p}: the superblock is marked failed: by the module when a metadata commit failed, or by 'tiercache detach --abandon' (or 'check --mark-failed') when an administrator gave the cache up")),
        "{}",
        e.msg
    );
    let h = e.hint.unwrap();
    assert!(
        h.contains("--format") && h.contains("writeback --force"),
        "{h}"
    );
    for needle in [
        "  FAILED:      the superblock is marked failed: ",
        "4 dirty (16 KiB), 1 clean, 1 uncommitted (ignored), 0 corrupt",
        "  result:      MARKED FAILED",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap_err();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["result"], "failed");
    assert_eq!(v["exit_code"], 15);
    assert_eq!(v["failed"], true);
    assert_eq!(v["superblock"]["flags"], 1);

    // Something worse applies first (the lowest code); the mark is still
    // shown.
    let mut img = failed_image(&entries());
    img[entry_off(8) + 3] ^= 0x10;
    let p = d.file("corrupt.img", &img);
    let (out, r) = run_check(&p);
    assert_eq!(r.unwrap_err().kind, Kind::BadEntries);
    assert!(
        out.contains("  FAILED:      the superblock is marked failed"),
        "{out}"
    );
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap_err();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (v["result"].as_str(), v["failed"].as_bool()),
        (Some("bad_entries"), Some(true))
    );

    // Without the mark: no such line, "failed": false.
    let p = d.file("ok.img", &image());
    let (out, _) = run_check(&p);
    assert!(!out.contains("FAILED"), "{out}");
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (v["failed"].as_bool(), v["superblock"]["flags"].as_u64()),
        (Some(false), Some(0))
    );

    // An unknown flag bit: a superblock with impossible fields.
    let mut img = image();
    let f = std::mem::offset_of!(ffi::tc_disk_sb, flags);
    let c = std::mem::offset_of!(ffi::tc_disk_sb, csum);
    img[f..f + 4].copy_from_slice(&3u32.to_le_bytes());
    img[c..c + 4].fill(0);
    let crc = disk::crc(&img[..disk::SB_BYTES]);
    img[c..c + 4].copy_from_slice(&crc.to_le_bytes());
    let (k, _) = check_kind(&img);
    assert_eq!(k, Some(Kind::BadSuperblock));
}

#[test]
fn check_mark_failed_marks_only_the_cache_named() {
    let d = TempDir::new("markfailed");
    let img = image();
    let p = d.file("cache.img", &img);
    let mark = |uuid: &str, origin: Option<u64>| {
        let mut out = vec![];
        let r = mark_failed(&p, uuid, origin, &mut out);
        (r, String::from_utf8(out).unwrap())
    };
    // The cache of another device, or of another origin: nothing written.
    for (uuid, origin, why) in [
        ("TIERCACHE-u", None, "(uuid TIERCACHE-t, not TIERCACHE-u)"),
        (
            "TIERCACHE-t",
            Some(8192),
            "(an origin of 16384 sectors, not 8192)",
        ),
    ] {
        let (r, out) = mark(uuid, origin);
        let e = r.unwrap_err();
        assert_eq!((e.kind, e.kind.exit_code()), (Kind::Busy, 4));
        assert_eq!(
            e.msg,
            format!("{p}: its superblock is the cache of another device {why}; not marked")
        );
        assert!(e.hint.unwrap().contains(&format!("'tiercache check {p}'")));
        assert_eq!(out, "");
        assert!(std::fs::read(&p).unwrap() == img);
    }
    // The one named: marked, and check then says so (exit 15); the rest
    // of the device as it was.
    let (r, out) = mark("TIERCACHE-t", Some(ORIGIN_SECTORS));
    r.unwrap();
    assert_eq!(
        out,
        format!("{p} (cache of TIERCACHE-t): superblock marked failed: no module loads it again (format it to reuse the device)\n")
    );
    let after = std::fs::read(&p).unwrap();
    assert!(after[disk::SB_BYTES..] == img[disk::SB_BYTES..]);
    let (_, r) = run_check(&p);
    assert_eq!(r.unwrap_err().kind, Kind::SbFailed);
    // Again: marked already, nothing written.
    let (r, out) = mark("TIERCACHE-t", None);
    r.unwrap();
    assert!(
        out.ends_with(": superblock marked failed already: nothing written\n"),
        "{out}"
    );
    assert!(std::fs::read(&p).unwrap() == after);

    // Nothing to mark: blank (11), corrupt (12), with a hint.
    let blank = d.file("blank.img", &vec![0u8; (CACHE_SECTORS * 512) as usize]);
    let e = mark_failed(&blank, "TIERCACHE-t", None, &mut vec![]).unwrap_err();
    assert_eq!(e.kind.exit_code(), 11);
    assert!(e
        .hint
        .unwrap()
        .contains("no module loads this device as it reads now"));
    let mut bad = image();
    bad[100] ^= 1;
    let badp = d.file("bad.img", &bad);
    let e = mark_failed(&badp, "TIERCACHE-t", None, &mut vec![]).unwrap_err();
    assert_eq!(e.kind.exit_code(), 12);
    assert!(std::fs::read(&badp).unwrap() == bad);
    // No such file (10).
    let e = mark_failed(&format!("{p}.none"), "TIERCACHE-t", None, &mut vec![]).unwrap_err();
    assert_eq!(e.kind.exit_code(), 10);
}

#[test]
fn dump_shows_the_failed_mark() {
    let d = TempDir::new("dumpfailed");
    let p = d.file("cache.img", &failed_image(&entries()));
    let mut o = vec![];
    // Shown, not judged.
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.contains("  flags           0x1 (failed: the superblock is marked failed: "),
        "{t}"
    );
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["superblock"]["flags"], 1);
    assert_eq!(v["superblock"]["failed"], true);
    assert_eq!(v["entries"].as_array().unwrap().len(), 6);

    let p = d.file("ok.img", &image());
    let mut o = vec![];
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(t.contains("  flags           0x0\n"), "{t}");
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["superblock"]["failed"], false);
}

#[test]
fn writeback_of_a_failed_cache_needs_force() {
    let d = TempDir::new("wbfailed");
    let img = failed_image(&entries());
    let cache = d.file("cache.img", &img);
    let origin = d.file("origin.img", &origin_image());
    for dry_run in [false, true] {
        let mut out = vec![];
        let e = writeback(&cache, &origin, dry_run, false, &mut out, &mut vec![]).unwrap_err();
        assert_eq!((e.kind, e.kind.exit_code()), (Kind::SbFailed, 15));
        assert!(
            e.msg.contains("the superblock is marked failed")
                && e.msg
                    .contains("may hold newer data than these 4 dirty blocks: refusing"),
            "{}",
            e.msg
        );
        assert!(e.hint.unwrap().contains("--force"));
        let out = String::from_utf8(out).unwrap();
        if !dry_run {
            assert_eq!(out, "");
            continue;
        }
        // A dry run lists what --force would write, then is refused.
        assert_eq!(
            out,
            format!(
                "{cache} (cache of TIERCACHE-t): marked failed: refused without --force, which would write \
                 4 dirty blocks (16 KiB) to {origin} in 2 writes, epoch by epoch (epoch 0, the origin \
                 synced after each):\n\
                 \x20 epoch 0: 4 blocks (16 KiB) in 2 writes\n\
                 \x20   origin blocks 10-12 (12 KiB at sector 80) from slots 7, 0-1\n\
                 \x20   origin blocks 40 (4 KiB at sector 320) from slots 8\n\
                 dry run: nothing written\n"
            )
        );
    }
    assert!(std::fs::read(&origin).unwrap() == origin_image());
    assert!(std::fs::read(&cache).unwrap() == img);
    // A dry run with --force: the same list, exit 0, no "writing" warning.
    let (mut out, mut err) = (vec![], vec![]);
    let sum = writeback(&cache, &origin, true, true, &mut out, &mut err).unwrap();
    assert_eq!((sum.blocks, sum.writes), (4, 2));
    assert!(String::from_utf8(out)
        .unwrap()
        .contains(": would write 4 dirty blocks (16 KiB) to "));
    assert!(err.is_empty());
    assert!(std::fs::read(&origin).unwrap() == origin_image());

    // --force: written back, with a warning; the mark stays.
    let mut err = vec![];
    let sum = writeback(&cache, &origin, false, true, &mut vec![], &mut err).unwrap();
    assert_eq!((sum.blocks, sum.writes), (4, 2));
    let err = String::from_utf8(err).unwrap();
    assert!(
        err.contains(
            "the superblock is marked failed; writing its dirty blocks back anyway (--force)"
        ),
        "{err}"
    );
    let got = std::fs::read(&origin).unwrap();
    assert_eq!((got[10 * 4096], got[40 * 4096]), (fill(10), fill(40)));
    let after = std::fs::read(&cache).unwrap();
    assert_eq!(after[..512], img[..512], "the superblock is not rewritten");

    // Nothing dirty: nothing to refuse.
    let cache = d.file("clean.img", &failed_image(&[(9, 41, false, 7)]));
    let mut out = vec![];
    let sum = writeback(&cache, &origin, false, false, &mut out, &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 0);
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("nothing to write back"));
}

/// The image of `image()` as the version 1 code wrote it: version 1,
/// no generation (the entries' last word zero).
fn v1_image() -> Vec<u8> {
    build_image(&sb_v(7, 1), CACHE_SECTORS, &entries(), fill)
}

#[test]
fn version_1_image_still_reads() {
    let img = v1_image();
    // What the version 1 code wrote: reserved words zero.
    assert_eq!(&img[8..12], &1u32.to_le_bytes());
    assert_eq!(&img[entry_off(0) + 28..entry_off(0) + 32], &[0u8; 4]);
    let d = TempDir::new("v1");
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    r.unwrap();
    for needle in [
        "format version 1 (the module writes version 3 from its first commit)",
        "generation:  0x00000000",
        "4 dirty (16 KiB), 1 clean, 1 uncommitted (ignored), 0 corrupt",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (
            v["superblock"]["version"].as_u64(),
            v["superblock"]["generation"].as_u64()
        ),
        (Some(1), Some(0))
    );
    assert_eq!(v["entries"].as_array().unwrap().len(), 6);

    // The offline writeback marks the entries clean in version 1's own
    // terms (generation 0, the superblock left at version 1).
    let origin = d.file("origin.img", &origin_image());
    let sum = writeback(&p, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 4);
    let after = std::fs::read(&p).unwrap();
    assert_eq!(after[..512], img[..512], "the superblock is not rewritten");
    let v1 = disk::decode_sb(&after).1.unwrap();
    let e = disk::decode_entry(&after[entry_off(7)..entry_off(7) + 32], 7, &v1);
    assert_eq!((e.state, e.block), (EntryState::Clean, Some(10)));
    assert_eq!(&after[entry_off(7) + 28..entry_off(7) + 32], &[0u8; 4]);
}

#[test]
fn garbage_in_the_entry_area_reads_as_empty() {
    // A fresh format over a device that held something else: the
    // superblock only, the entry area as it was.
    let l = sb(1).layout;
    let mut img = build_image(&sb(1), CACHE_SECTORS, &[], fill);
    let area = (l.meta_start * 512) as usize..(l.meta_end_sector() * 512) as usize;
    garbage(&mut img[area], 0x0123_4567_89ab_cdef);
    let d = TempDir::new("garbage");
    let p = d.file("cache.img", &img);
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["result"], "ok");
    assert_eq!(v["counts"]["foreign"], l.nr_slots);
    for k in ["empty", "clean", "dirty", "uncommitted", "corrupt"] {
        assert_eq!(v["counts"][k], 0, "{k}");
    }
    // dump lists nothing but with --all; writeback has nothing to do.
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["entries"].as_array().unwrap().len(), 0);
    let mut o = vec![];
    dump(&p, false, true, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.lines()
            .any(|r| r.split_whitespace().collect::<Vec<_>>() == ["0", "-", "foreign", "-", "-"]),
        "{t}"
    );
    let origin = d.file("origin.img", &origin_image());
    let sum = writeback(&p, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 0);
    assert!(std::fs::read(&origin).unwrap() == origin_image());
}

#[test]
fn previous_generation_entry_reads_as_empty() {
    // The image of the previous format (generation G - 1, with its
    // committed dirty blocks), formatted again: the superblock of
    // generation G, commit 1, and one new entry of this generation.
    let old = Superblock {
        generation: G - 1,
        ..sb(7)
    };
    let mut img = build_image(&old, CACHE_SECTORS, &entries(), fill);
    let new = sb(1);
    img[..disk::SB_BYTES].copy_from_slice(&disk::encode_sb(&new));
    let o = entry_off(30);
    img[o..o + 32].copy_from_slice(&disk::encode_entry(30, 99, true, 1, G, 0));
    let d30 = new.layout.slot_offset(30) as usize;
    img[d30..d30 + 4096].fill(fill(99));
    // The old generation's summary block, left under the new one, reads
    // as bad (a format writes every summary block in its generation): it
    // marks all its metadata blocks, a warning, not an error...
    let d = TempDir::new("oldgen");
    let (out, r) = run_check(&d.file("oldsum.img", &img));
    r.unwrap();
    for needle in [
        "  summary:     8 of 8 metadata blocks marked, 1 with dirty entries (1 summary block from sector 72)\n",
        "  warning:     summary block 0 torn, damaged or not of this format: its 8 metadata blocks read as marked\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    // ... and the new format's own, the new dirty entry's metadata block
    // marked by the module before writing it, is valid.
    disk::write_summary(&mut img, &new, &[0]);
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    r.unwrap();
    assert!(
        !out.contains("warning:") && !out.contains("unmarked:"),
        "{out}"
    );
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["counts"]["dirty"], 1);
    assert_eq!(v["counts"]["foreign"], 6);
    assert_eq!(v["counts"]["uncommitted"], 0);
    assert_eq!(v["counts"]["corrupt"], 0);
    let mut o = vec![];
    dump(&p, true, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    let es = v["entries"].as_array().unwrap();
    assert_eq!(es[7]["state"], "foreign");
    assert_eq!(es[7]["block"], serde_json::Value::Null);
    assert_eq!(es[30]["state"], "dirty");
    // The offline writeback writes only this generation's dirty block.
    let origin = d.file("origin.img", &origin_image());
    let sum = writeback(&p, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 1);
    let got = std::fs::read(&origin).unwrap();
    assert_eq!(got[99 * 4096], fill(99));
    assert_eq!(
        got[10 * 4096],
        0xee,
        "block 10 was dirty in the old generation only"
    );
    let after = std::fs::read(&p).unwrap();
    assert_eq!(
        after[entry_off(7)..entry_off(7) + 32],
        img[entry_off(7)..entry_off(7) + 32]
    );
}

/// A version 3 image of superblock epoch 5 (the epoch bits wrap at
/// 0x10000 + 5): blocks 10, 11 and 13 dirty in epoch 5, 12 in epoch 6,
/// 40 in epoch 0x10004 (written as bits 0x0004); 41 clean; 500 dirty,
/// uncommitted.  Slot data: block + epoch (mod 256).
fn epoch_sb() -> Superblock {
    Superblock { epoch: 5, ..sb(7) }
}

fn epoch_entries() -> Vec<(u64, u64, bool, u64, u64)> {
    vec![
        (0, 11, true, 5, 5),
        (1, 12, true, 6, 6),
        (7, 10, true, 7, 5),
        (3, 13, true, 7, 5),
        (8, 40, true, 7, 0x1_0004),
        (9, 41, false, 7, 0),
        (10, 500, true, 8, 6),
    ]
}

fn epoch_fill(block: u64, epoch: u64) -> u8 {
    (block + epoch) as u8
}

fn epoch_image() -> Vec<u8> {
    disk::build_image_epochs(&epoch_sb(), CACHE_SECTORS, &epoch_entries(), epoch_fill)
}

/// Writes (byte offset, data) and syncs (None), in order.
type WriteLog = Vec<Option<(u64, Vec<u8>)>>;

/// A device in memory that records its writes and syncs, and fails every
/// write after the first `allow` (a crash or an IO error there).
struct RecDev {
    name: &'static str,
    data: std::cell::RefCell<Vec<u8>>,
    log: std::cell::RefCell<WriteLog>,
    allow: usize,
}

impl RecDev {
    fn new(name: &'static str, data: Vec<u8>, allow: usize) -> RecDev {
        RecDev {
            name,
            data: std::cell::RefCell::new(data),
            log: std::cell::RefCell::new(vec![]),
            allow,
        }
    }
    /// An origin that takes every write.
    fn origin() -> RecDev {
        RecDev::new("origin", origin_image(), usize::MAX)
    }
    /// The log as (byte offset, length) of each write, None for a sync.
    fn shape(&self) -> Vec<Option<(u64, usize)>> {
        self.log
            .borrow()
            .iter()
            .map(|w| w.as_ref().map(|(o, d)| (*o, d.len())))
            .collect()
    }
}

impl ReadAt for RecDev {
    fn name(&self) -> &str {
        self.name
    }
    fn size_bytes(&self) -> u64 {
        self.data.borrow().len() as u64
    }
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        Ok(self.data.borrow()[off as usize..off as usize + len].to_vec())
    }
}

impl disk::WriteAt for RecDev {
    fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        let mut log = self.log.borrow_mut();
        if log.iter().flatten().count() >= self.allow {
            return Err(Error::new(
                Kind::Unreadable,
                format!("{}: write failed", self.name),
            ));
        }
        self.data.borrow_mut()[off as usize..off as usize + data.len()].copy_from_slice(data);
        log.push(Some((off, data.to_vec())));
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        self.log.borrow_mut().push(None);
        Ok(())
    }
    fn devno(&self) -> Option<(u32, u32)> {
        None
    }
}

/// Check that the writes of `log` go epoch by epoch, oldest first, with a
/// sync between two epochs and after the last: whatever part of the
/// writes since the last sync a power cut keeps, the origin holds every
/// epoch before the one being written and a part of that one.  `epochs`
/// is the epoch of each write, in write order.
fn assert_power_cut_states(log: &[Option<(u64, usize)>], epochs: &[u64]) {
    let mut last: Option<u64> = None;
    let mut synced = true;
    let mut k = 0;
    for op in log {
        match *op {
            None => synced = true,
            Some(_) => {
                let e = epochs[k];
                k += 1;
                if let Some(l) = last {
                    assert!(e >= l, "epoch {e} written after epoch {l}: {log:?}");
                    assert!(
                        e == l || synced,
                        "epoch {e} without a sync after {l}: {log:?}"
                    );
                }
                last = Some(e);
                synced = false;
            }
        }
    }
    assert!(synced, "the last epoch is synced: {log:?}");
    assert_eq!(k, epochs.len());
}

/// The epoch of each origin write of `plan`, in order.
fn write_epochs(plan: &[EpochPlan]) -> Vec<u64> {
    plan.iter()
        .flat_map(|e| e.runs.iter().map(move |_| e.epoch))
        .collect()
}

#[test]
fn writeback_plan_goes_epoch_by_epoch() {
    let m = disk::MemImage {
        name: "cache".into(),
        data: epoch_image(),
    };
    let sb = epoch_sb();
    let s = disk::survey(&m, &sb).unwrap();
    let v = s.versions_to_write();
    let order: Vec<(u64, u64)> = v.iter().map(|d| (d.epoch, d.block)).collect();
    assert_eq!(order, [(5, 10), (5, 11), (5, 13), (6, 12), (0x1_0004, 40)]);
    let plan = plan_writeback(&v, 4096, MAX_WRITE_BYTES);
    let shape: Vec<(u64, Vec<Vec<u64>>)> = plan
        .iter()
        .map(|e| {
            (
                e.epoch,
                e.runs
                    .iter()
                    .map(|r| r.blocks.iter().map(|d| d.block).collect())
                    .collect(),
            )
        })
        .collect();
    // 10-13 are adjacent, but 12 is of another epoch: no run joins epochs.
    assert_eq!(
        shape,
        [
            (5, vec![vec![10, 11], vec![13]]),
            (6, vec![vec![12]]),
            (0x1_0004, vec![vec![40]]),
        ]
    );
    assert_eq!(epochs_note(&plan), "3 epochs, 5 to 65540");
    assert_eq!(epochs_note(&plan[1..2]), "epoch 6");

    let origin = RecDev::origin();
    write_plan(&m, &origin, &sb, &plan).unwrap();
    let log = origin.shape();
    assert_eq!(
        log,
        [
            Some((10 * 4096, 8192)),
            Some((13 * 4096, 4096)),
            None,
            Some((12 * 4096, 4096)),
            None,
            Some((40 * 4096, 4096)),
            None
        ]
    );
    assert_power_cut_states(&log, &write_epochs(&plan));
    let got = origin.data.borrow();
    for d in &v {
        let o = (d.block * 4096) as usize;
        assert!(got[o..o + 4096]
            .iter()
            .all(|&x| x == epoch_fill(d.block, d.epoch)));
    }
}

#[test]
fn writeback_by_epoch_onto_a_file_origin() {
    let d = TempDir::new("wbep");
    let cache = d.file("cache.img", &epoch_image());
    let origin = d.file("origin.img", &origin_image());
    // The dry run lists per epoch.
    let mut out = vec![];
    let sum = writeback(&cache, &origin, true, false, &mut out, &mut vec![]).unwrap();
    assert_eq!((sum.blocks, sum.writes, sum.epochs), (5, 4, 3));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!(
            "{cache} (cache of TIERCACHE-t): would write 5 dirty blocks (20 KiB) to {origin} in 4 writes, \
             epoch by epoch (3 epochs, 5 to 65540, the origin synced after each):\n\
             \x20 epoch 5: 3 blocks (12 KiB) in 2 writes\n\
             \x20   origin blocks 10-11 (8 KiB at sector 80) from slots 7, 0\n\
             \x20   origin blocks 13 (4 KiB at sector 104) from slots 3\n\
             \x20 epoch 6: 1 block (4 KiB) in 1 write\n\
             \x20   origin blocks 12 (4 KiB at sector 96) from slots 1\n\
             \x20 epoch 65540: 1 block (4 KiB) in 1 write\n\
             \x20   origin blocks 40 (4 KiB at sector 320) from slots 8\n\
             dry run: nothing written\n"
        )
    );
    assert!(std::fs::read(&origin).unwrap() == origin_image());
    // Written: each block holds its version, the entries are clean.
    let mut out = vec![];
    let sum = writeback(&cache, &origin, false, false, &mut out, &mut vec![]).unwrap();
    assert_eq!((sum.blocks, sum.writes, sum.epochs), (5, 4, 3));
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains(
            "wrote 5 dirty blocks (20 KiB) from {cache} (cache of TIERCACHE-t) in 4 writes, epoch by epoch \
             (3 epochs, 5 to 65540, the origin synced after each); marked clean in its metadata"
                .replace("{cache}", &cache)
                .as_str()
        ),
        "{out}"
    );
    let got = std::fs::read(&origin).unwrap();
    for (b, e) in [(10u64, 5u64), (11, 5), (12, 6), (13, 5), (40, 0x1_0004)] {
        assert_eq!(got[(b * 4096) as usize], epoch_fill(b, e), "block {b}");
    }
    assert_eq!(got[41 * 4096], 0xee);
    assert_eq!(got[500 * 4096], 0xee);
    let mut o = vec![];
    check(&cache, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (v["counts"]["dirty"].as_u64(), v["counts"]["clean"].as_u64()),
        (Some(0), Some(6))
    );
}

/// Versions of blocks in several epochs (superblock epoch 100): block 5
/// in epochs 100, 101 and 103, block 6 in 100 and 101, block 7 in 102,
/// block 8 clean.  Slot data: block + epoch.
fn chain_entries() -> Vec<(u64, u64, bool, u64, u64)> {
    vec![
        (0, 5, true, 7, 103),
        (1, 5, true, 5, 100),
        (2, 6, true, 6, 101),
        (3, 7, true, 7, 102),
        (4, 5, true, 6, 101),
        (5, 6, true, 5, 100),
        (6, 8, false, 7, 0),
    ]
}

fn chain_sb() -> Superblock {
    Superblock {
        epoch: 100,
        ..sb(7)
    }
}

#[test]
fn check_applies_the_version_chain_rule() {
    let d = TempDir::new("chains");
    let img = disk::build_image_epochs(&chain_sb(), CACHE_SECTORS, &chain_entries(), epoch_fill);
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    r.unwrap();
    for needle in [
        "  slots used:  7 of ",
        ": 6 dirty (24 KiB), 1 clean,",
        "  epochs:      4 live, oldest 100, newest 103 (the superblock's lower bound: 100); \
         2 origin blocks dirty in several epochs (the newest version is the data)\n",
        "result:      consistent",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let mut o = vec![];
    check(&p, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    let e = &v["epochs"];
    assert_eq!(
        (
            e["superblock"].as_u64(),
            e["live"].as_u64(),
            e["oldest"].as_u64(),
            e["newest"].as_u64()
        ),
        (Some(100), Some(4), Some(100), Some(103))
    );
    assert_eq!(e["versioned_blocks"], 2);
    assert_eq!(
        e["per_epoch"][1],
        serde_json::json!({"epoch": 101, "dirty": 2})
    );
    assert_eq!(v["duplicates"], serde_json::json!([]));

    // Block 6 twice in epoch 101: a duplicate (exit 14), named with its epoch.
    let mut es = chain_entries();
    es.push((20, 6, true, 4, 101));
    let img2 = disk::build_image_epochs(&chain_sb(), CACHE_SECTORS, &es, epoch_fill);
    let p2 = d.file("dup.img", &img2);
    let (out, r) = run_check(&p2);
    let e = r.unwrap_err();
    assert_eq!(e.kind, Kind::DuplicateDirty);
    assert!(
        e.msg.ends_with(
            "1 origin block is dirty in more than one slot of one epoch (block 6 in epoch 101)"
        ),
        "{}",
        e.msg
    );
    assert!(
        out.contains("  duplicate:   origin block 6 is dirty in slot 2 (seq 6), slot 20 (seq 4), all of epoch 101\n"),
        "{out}"
    );
    let mut o = vec![];
    check(&p2, true, &mut o, &mut vec![]).unwrap_err();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        v["duplicates"],
        serde_json::json!([{"block": 6, "epoch": 101, "slots": [2, 20], "seqs": [6, 4]}])
    );

    // The same chains in a version 2 cache: every epoch 0 there, so any two
    // dirty entries of one block are a duplicate, as before.
    let v2 = sb_v(7, disk::VERSION_V2);
    let es: Vec<(u64, u64, bool, u64)> = chain_entries()
        .iter()
        .map(|&(s, b, d, q, _)| (s, b, d, q))
        .collect();
    let (out, r) = run_check(&d.file("v2.img", &build_image(&v2, CACHE_SECTORS, &es, fill)));
    let e = r.unwrap_err();
    assert!(
        e.msg
            .ends_with(": 2 origin blocks are dirty in more than one slot (blocks 5, 6)"),
        "{}",
        e.msg
    );
    assert!(
        out.contains(
            "  epochs:      none in format version 2 (its dirty entries read as epoch 0)\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("origin block 5 is dirty in slot 0 (seq 7), slot 1 (seq 5), slot 4 (seq 6)\n"),
        "{out}"
    );

    // Nothing dirty: no live epoch.
    let (out, _) = run_check(&d.file(
        "clean.img",
        &disk::build_image_epochs(
            &chain_sb(),
            CACHE_SECTORS,
            &[(6, 8, false, 7, 0)],
            epoch_fill,
        ),
    ));
    assert!(out.contains("  epochs:      none live (no committed dirty entry; the superblock's lower bound: 100)\n"), "{out}");
}

#[test]
fn writeback_of_version_chains() {
    let img = disk::build_image_epochs(&chain_sb(), CACHE_SECTORS, &chain_entries(), epoch_fill);
    let m = disk::MemImage {
        name: "cache".into(),
        data: img.clone(),
    };
    let sb = chain_sb();
    let s = disk::survey(&m, &sb).unwrap();
    let v = s.versions_to_write();
    let plan = plan_writeback(&v, 4096, MAX_WRITE_BYTES);
    let shape: Vec<(u64, Vec<(u64, u64)>)> = plan
        .iter()
        .map(|e| {
            (
                e.epoch,
                e.runs
                    .iter()
                    .map(|r| (r.first_block(), r.blocks.len() as u64))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (100, vec![(5, 2)]),
            (101, vec![(5, 2)]),
            (102, vec![(7, 1)]),
            (103, vec![(5, 1)])
        ]
    );
    let origin = RecDev::origin();
    write_plan(&m, &origin, &sb, &plan).unwrap();
    let log = origin.shape();
    assert_power_cut_states(&log, &write_epochs(&plan));
    assert_eq!(
        log.iter().filter(|o| o.is_none()).count(),
        4,
        "a sync per epoch"
    );
    // The newest version of each block is what the origin holds.
    let got = origin.data.borrow().clone();
    for (b, e) in [(5u64, 103u64), (6, 101), (7, 102)] {
        assert_eq!(got[(b * 4096) as usize], epoch_fill(b, e), "block {b}");
    }
    assert_eq!(got[8 * 4096], 0xee);

    // Through the command: a dry run, then the writeback; the summary
    // counts versions and origin blocks apart.
    let d = TempDir::new("wbchain");
    let cache = d.file("cache.img", &img);
    let originp = d.file("origin.img", &origin_image());
    let mut out = vec![];
    let sum = writeback(&cache, &originp, true, false, &mut out, &mut vec![]).unwrap();
    assert_eq!(
        (sum.blocks, sum.origin_blocks, sum.writes, sum.epochs),
        (6, 3, 4, 4)
    );
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains(": would write 6 dirty versions of 3 origin blocks (24 KiB) to "),
        "{out}"
    );
    assert!(out.contains("  epoch 101: 2 blocks (8 KiB) in 1 write\n    origin blocks 5-6 (8 KiB at sector 40) from slots 4, 2\n"), "{out}");
    let mut out = vec![];
    writeback(&cache, &originp, false, false, &mut out, &mut vec![]).unwrap();
    assert!(String::from_utf8(out)
        .unwrap()
        .contains(": wrote 6 dirty versions of 3 origin blocks (24 KiB) from "));
    assert!(std::fs::read(&originp).unwrap() == got);
    let mut o = vec![];
    check(&cache, true, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(
        (v["counts"]["dirty"].as_u64(), v["epochs"]["live"].as_u64()),
        (Some(0), Some(0))
    );

    // A duplicate in one epoch: refused; --force leaves every version of
    // that block as it is and writes the others, epoch by epoch.
    let mut es = chain_entries();
    es.push((20, 6, true, 4, 101));
    let cache = d.file(
        "dup.img",
        &disk::build_image_epochs(&chain_sb(), CACHE_SECTORS, &es, epoch_fill),
    );
    let originp = d.file("origin2.img", &origin_image());
    let mut err = vec![];
    let e = writeback(&cache, &originp, false, false, &mut vec![], &mut err).unwrap_err();
    assert_eq!(e.kind, Kind::DuplicateDirty);
    assert!(
        e.msg
            .contains("dirty in more than one slot of one epoch (listed above)"),
        "{}",
        e.msg
    );
    assert!(String::from_utf8(err)
        .unwrap()
        .contains("origin block 6 is dirty in slots 2, 20 (seqs 6, 4), all of epoch 101\n"));
    let sum = writeback(&cache, &originp, false, true, &mut vec![], &mut vec![]).unwrap();
    assert_eq!(
        (
            sum.blocks,
            sum.origin_blocks,
            sum.epochs,
            sum.skipped_duplicate
        ),
        (4, 2, 4, 1)
    );
    let got = std::fs::read(&originp).unwrap();
    assert_eq!(
        (got[5 * 4096], got[6 * 4096], got[7 * 4096]),
        (epoch_fill(5, 103), 0xee, epoch_fill(7, 102))
    );
}

#[test]
fn dump_shows_the_epochs() {
    let d = TempDir::new("dumpep");
    let p = d.file("cache.img", &epoch_image());
    let mut o = vec![];
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.contains("  epoch           5 (dirty entries are of this epoch or later)\n"),
        "{t}"
    );
    assert!(t.contains("SEQ      EPOCH\n"), "{t}");
    let rows: Vec<Vec<&str>> = t
        .lines()
        .skip_while(|l| !l.contains("SLOT"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    // Absolute epochs, across the wrap of the 16 bits (40: bits 0x0004,
    // epoch 0x10004); none for a clean entry; an uncommitted one's too.
    assert_eq!(
        rows,
        [
            vec!["0", "11", "dirty", "5", "5"],
            vec!["1", "12", "dirty", "6", "6"],
            vec!["3", "13", "dirty", "7", "5"],
            vec!["7", "10", "dirty", "7", "5"],
            vec!["8", "40", "dirty", "7", "65540"],
            vec!["9", "41", "clean", "7", "-"],
            vec![
                "10",
                "500",
                "uncommitted",
                "8",
                "6",
                "ignored:",
                "newer",
                "than",
                "commit",
                "7"
            ],
        ]
    );
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert_eq!(v["superblock"]["epoch"], 5);
    let es = v["entries"].as_array().unwrap();
    assert_eq!(
        (es[4]["block"].as_u64(), es[4]["epoch"].as_u64()),
        (Some(40), Some(0x1_0004))
    );
    assert!(es[5]["epoch"].is_null());

    // Epoch bits in a version 2 cache: invalid flags, shown with no epoch.
    let v2 = sb_v(7, disk::VERSION_V2);
    let mut img = epoch_image();
    img[..disk::SB_BYTES].copy_from_slice(&disk::encode_sb(&v2));
    let p = d.file("v2.img", &img);
    let mut o = vec![];
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.contains("  epoch           0 (format version 2: no epochs)\n"),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.split_whitespace().take(5).collect::<Vec<_>>()
                == ["1", "-", "bad_flags", "-", "-"]),
        "{t}"
    );
}

#[test]
fn writeback_of_a_version_2_cache_lists_no_epochs() {
    let v2 = sb_v(7, disk::VERSION_V2);
    let d = TempDir::new("wbv2");
    let cache = d.file(
        "cache.img",
        &build_image(&v2, CACHE_SECTORS, &entries(), fill),
    );
    let origin = d.file("origin.img", &origin_image());
    let mut out = vec![];
    let sum = writeback(&cache, &origin, true, false, &mut out, &mut vec![]).unwrap();
    assert_eq!((sum.blocks, sum.writes, sum.epochs), (4, 2, 1));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!(
            "{cache} (cache of TIERCACHE-t): would write 4 dirty blocks (16 KiB) to {origin} in 2 writes:\n\
             \x20 origin blocks 10-12 (12 KiB at sector 80) from slots 7, 0-1\n\
             \x20 origin blocks 40 (4 KiB at sector 320) from slots 8\n\
             dry run: nothing written\n"
        )
    );
    let mut out = vec![];
    writeback(&cache, &origin, false, false, &mut out, &mut vec![]).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.ends_with(" in 2 writes; marked clean in its metadata\n"),
        "{out}"
    );
    // The superblock stays version 2; the entries are clean.
    let after = std::fs::read(&cache).unwrap();
    assert_eq!(disk::decode_sb(&after).1.unwrap().version, 2);
    assert_eq!(std::fs::read(&origin).unwrap()[12 * 4096], fill(12));
}

#[test]
fn runs_merge_adjacent_blocks_up_to_the_limit() {
    let refs: Vec<DirtyRef> = [1u64, 2, 3, 4, 5, 9, 10]
        .iter()
        .enumerate()
        .map(|(i, &b)| DirtyRef {
            block: b,
            slot: 100 - i as u64,
            seq: 1,
            epoch: 0,
        })
        .collect();
    let runs = plan_runs(&refs, 4096, 3 * 4096);
    let firsts: Vec<(u64, u64)> = runs
        .iter()
        .map(|r| (r.first_block(), r.blocks.len() as u64))
        .collect();
    assert_eq!(firsts, vec![(1, 3), (4, 2), (9, 2)]);
    assert_eq!(ranges([1u64, 2, 3, 5, 7, 8].into_iter()), "1-3, 5, 7-8");
}

// --------------------------------------------------------------------
// The summary (version 4)
// --------------------------------------------------------------------

/// Entries in three metadata blocks of 128 entries: dirty block 20 in
/// slot 300 (metadata block 2), clean 21 in slot 130 (block 1), dirty 22
/// uncommitted in slot 700 (block 5).  `build_image` marks blocks 2 and 5.
fn sum_entries() -> Vec<(u64, u64, bool, u64)> {
    vec![(300, 20, true, 5), (130, 21, false, 5), (700, 22, true, 9)]
}

fn sum_image() -> Vec<u8> {
    build_image(&sb(7), CACHE_SECTORS, &sum_entries(), fill)
}

/// Check an image: the report (JSON) and the error.
fn check_json(d: &TempDir, name: &str, img: &[u8]) -> (serde_json::Value, Option<Error>) {
    let p = d.file(name, img);
    let mut o = vec![];
    let r = check(&p, true, &mut o, &mut vec![]);
    (serde_json::from_slice(&o).unwrap(), r.err())
}

#[test]
fn check_accepts_a_summary_that_marks_the_dirty_blocks() {
    assert_eq!(disk::entries_per_mblock(), 128);
    let d = TempDir::new("sumok");
    let p = d.file("cache.img", &sum_image());
    let (out, r) = run_check(&p);
    r.unwrap();
    assert!(
        out.contains(
            "  summary:     2 of 8 metadata blocks marked, 2 with dirty entries (1 summary block from sector 72)\n"
        ),
        "{out}"
    );
    assert!(
        !out.contains("warning:") && !out.contains("unmarked:"),
        "{out}"
    );
    // More marked than dirty is fine: a bit is "may hold a dirty entry"
    // (the clean entry's block 1, block 7 with nothing).
    let mut img = sum_image();
    disk::write_summary(&mut img, &sb(7), &[1, 2, 5, 7]);
    let (v, e) = check_json(&d, "more.img", &img);
    assert!(e.is_none(), "{e:?}");
    assert_eq!(
        (
            &v["result"],
            &v["summary"]["marked"],
            &v["summary"]["dirty_meta_blocks"]
        ),
        (
            &serde_json::json!("ok"),
            &serde_json::json!(4),
            &serde_json::json!(2)
        )
    );
}

#[test]
fn check_finds_dirty_blocks_the_summary_does_not_mark() {
    let d = TempDir::new("sumbad");
    // Block 2's bit clear (committed dirty entry): an error, exit 13.
    let mut img = sum_image();
    disk::write_summary(&mut img, &sb(7), &[5]);
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    let e = r.unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::BadEntries, 13));
    assert_eq!(
        e.msg,
        format!(
            "{p}: 1 metadata block holds dirty entries but is not marked in the summary (metadata block 2)"
        )
    );
    assert!(
        e.hint.as_deref().unwrap().contains("'tiercache writeback'"),
        "{e:?}"
    );
    for needle in [
        "  summary:     1 of 8 metadata blocks marked, 2 with dirty entries (1 summary block from sector 72)\n",
        "  unmarked:    metadata block 2 holds 1 dirty entry (the first in slot 300), but its bit in summary block 0 is clear\n",
        "  result:      DIRTY METADATA BLOCKS NOT MARKED IN THE SUMMARY\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let (v, _) = check_json(&d, "cache.img", &img);
    assert_eq!(
        (&v["result"], &v["exit_code"]),
        (&serde_json::json!("bad_summary"), &serde_json::json!(13))
    );
    assert_eq!(
        v["summary"]["unmarked"],
        serde_json::json!([{"meta_block": 2, "dirty_entries": 1, "first_slot": 300,
            "summary_block": 0}])
    );

    // Block 5's (an uncommitted dirty entry: the rule covers it too).
    let mut img = sum_image();
    disk::write_summary(&mut img, &sb(7), &[2]);
    let (v, e) = check_json(&d, "uncommitted.img", &img);
    assert_eq!(e.unwrap().kind, Kind::BadEntries);
    assert_eq!(v["summary"]["unmarked"][0]["meta_block"], 5);
    assert_eq!(v["summary"]["unmarked"][0]["first_slot"], 700);

    // The summary all clear (as a format writes it): both.
    let mut img = sum_image();
    disk::write_summary(&mut img, &sb(7), &[]);
    let p = d.file("none.img", &img);
    let (out, r) = run_check(&p);
    assert!(
        r.unwrap_err().msg.ends_with(
            ": 2 metadata blocks hold dirty entries but are not marked in the summary (metadata blocks 2, 5)"
        )
    );
    for needle in [
        "  summary:     0 of 8 metadata blocks marked, 2 with dirty entries (1 summary block from sector 72)\n",
        "  unmarked:    metadata block 5 holds 1 dirty entry (the first in slot 700), but its bit in summary block 0 is clear\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }

    // The summary block all zero (torn, or never written): bad, it marks
    // every metadata block of its range, a warning, not an error.
    let mut zero = sum_image();
    let o = disk::sum_offset(&sb(7).layout, 0) as usize;
    zero[o..o + disk::SUM_BYTES].fill(0);
    let (out, r) = run_check(&d.file("zero.img", &zero));
    r.unwrap();
    for needle in [
        "  summary:     8 of 8 metadata blocks marked, 2 with dirty entries (1 summary block from sector 72)\n",
        "  warning:     summary block 0 torn, damaged or not of this format: its 8 metadata blocks read as marked\n",
        "  result:      consistent\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    assert!(!out.contains("unmarked:"), "{out}");
    let (v, e) = check_json(&d, "zero.img", &zero);
    assert!(e.is_none(), "{e:?}");
    assert_eq!(
        (&v["summary"]["damaged"], &v["summary"]["unmarked"]),
        (
            &serde_json::json!([{"index": 0, "meta_blocks": 8}]),
            &serde_json::json!([])
        )
    );

    // Corrupt entries come first (same exit code, their own result).
    let mut img2 = img.clone();
    img2[entry_off(130) + 3] ^= 0x10;
    let (v, e) = check_json(&d, "both.img", &img2);
    assert!(e.unwrap().msg.ends_with(": 1 corrupt entry (slot 130)"));
    assert_eq!(v["result"], "bad_entries");
    assert_eq!(v["summary"]["unmarked"].as_array().unwrap().len(), 2);

    // The offline writeback reads every entry: it writes them back all the
    // same, and then the summary has nothing to mark.
    let origin = d.file("origin.img", &origin_image());
    let sum = writeback(&p, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    assert_eq!(sum.blocks, 1, "block 20; 22 is uncommitted");
    assert_eq!(std::fs::read(&origin).unwrap()[20 * 4096], fill(20));
    let (v, e) = check_json(&d, "after.img", &std::fs::read(&p).unwrap());
    assert_eq!(
        e.unwrap().kind,
        Kind::BadEntries,
        "the uncommitted entry is left"
    );
    assert_eq!(v["summary"]["unmarked"][0]["meta_block"], 5);
}

#[test]
fn check_reads_a_torn_summary_block_as_all_marked() {
    let d = TempDir::new("sumtorn");
    let mut img = sum_image();
    // Block 2's bit cleared, then the summary block torn: it reads as
    // marking all 8 metadata blocks, so nothing is missed.
    disk::write_summary(&mut img, &sb(7), &[5]);
    let o = disk::sum_offset(&sb(7).layout, 0) as usize;
    img[o + 2000] ^= 0x20;
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    r.unwrap();
    for needle in [
        "  summary:     8 of 8 metadata blocks marked, 2 with dirty entries (1 summary block from sector 72)\n",
        "  warning:     summary block 0 torn, damaged or not of this format: its 8 metadata blocks read as marked\n",
        "  result:      consistent\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let (v, e) = check_json(&d, "cache.img", &img);
    assert!(e.is_none());
    assert_eq!(
        v["summary"]["damaged"],
        serde_json::json!([{"index": 0, "meta_blocks": 8}])
    );
    // dump says so too.
    let mut o = vec![];
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.contains(
            "summary (1 block from sector 72): 8 of 8 metadata blocks marked\n  block 0 (metadata blocks 0-7): torn, damaged or not of this format (read as all set)\n"
        ),
        "{t}"
    );
}

#[test]
fn the_data_area_starts_after_the_summary() {
    // Computed here, not by the C layout: the entries, the summary block,
    // rounded up to the 8-sector block.
    let l = sb(7).layout;
    let entries_end = 8 + l.meta_blocks * 8;
    assert_eq!((l.sum_start, l.sum_blocks), (entries_end, 1));
    assert_eq!(l.data_start, entries_end + 8);
    assert_eq!(l.slot_offset(0), l.data_start * 512);
    // The writeback takes slot 300's data from there: the summary's bytes
    // are not data.
    let d = TempDir::new("sumdata");
    let cache = d.file("cache.img", &sum_image());
    let origin = d.file("origin.img", &origin_image());
    writeback(&cache, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    let got = std::fs::read(&origin).unwrap();
    assert!(got[20 * 4096..21 * 4096].iter().all(|&b| b == fill(20)));
}

#[test]
fn version_3_image_has_no_summary() {
    let v3 = sb_v(7, disk::VERSION_V3);
    let l = v3.layout;
    assert_eq!((l.sum_start, l.sum_blocks), (0, 0));
    assert_eq!(l.data_start, 8 + l.meta_blocks * 8);
    assert_eq!(l.nr_slots, sb(7).layout.nr_slots + 1);
    let img = build_image(&v3, CACHE_SECTORS, &sum_entries(), fill);
    assert_eq!(&img[8..12], &3u32.to_le_bytes());
    let d = TempDir::new("v3");
    let p = d.file("cache.img", &img);
    let (out, r) = run_check(&p);
    r.unwrap();
    for needle in [
        "format version 3 (no summary: the module reads every metadata block; a format makes version 4)\n",
        "  summary:     none in format version 3 (the module reads every metadata block)\n",
        "  result:      consistent\n",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    let (v, e) = check_json(&d, "cache.img", &img);
    assert!(e.is_none());
    assert!(v["summary"].is_null());
    assert_eq!(v["superblock"]["layout"]["sum_blocks"], 0);
    // dump: the layout without a summary.
    let mut o = vec![];
    dump(&p, false, false, &mut o, &mut vec![]).unwrap();
    let t = String::from_utf8(o).unwrap();
    assert!(
        t.contains("  sum_start       0\n  sum_blocks      0 (format version 3: no summary)\n"),
        "{t}"
    );
    assert!(!t.contains("\nsummary ("), "{t}");
    let mut o = vec![];
    dump(&p, true, false, &mut o, &mut vec![]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
    assert!(v["summary"].is_null());
    assert_eq!(v["superblock"]["sum_blocks"], 0);
    // The writeback reads slot 300 at the version 3 data start, and leaves
    // the superblock at version 3.
    let origin = d.file("origin.img", &origin_image());
    writeback(&p, &origin, false, false, &mut vec![], &mut vec![]).unwrap();
    let got = std::fs::read(&origin).unwrap();
    assert!(got[20 * 4096..21 * 4096].iter().all(|&b| b == fill(20)));
    assert_eq!(std::fs::read(&p).unwrap()[..512], img[..512]);
}

/// Versions of blocks 5 and 6 in several epochs, their slots in another
/// order than their epochs and in several metadata blocks (128 entries
/// each): block 5's newest version sits in the first one.
fn spread_chain_entries() -> Vec<(u64, u64, bool, u64, u64)> {
    vec![
        (0, 5, true, 7, 103),
        (200, 5, true, 5, 100),
        (130, 6, true, 6, 101),
        (3, 7, true, 7, 102),
        (300, 5, true, 6, 101),
        (600, 6, true, 5, 100),
    ]
}

/// For each origin block, the epochs of its versions still dirty in the
/// cache image `img` (ascending).
fn dirty_epochs(img: &[u8], sb: &Superblock) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let m = disk::MemImage {
        name: "cache".into(),
        data: img.to_vec(),
    };
    let mut out = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for d in disk::survey(&m, sb).unwrap().versions_to_write() {
        out.entry(d.block).or_default().push(d.epoch);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[test]
fn mark_clean_goes_epoch_by_epoch_and_a_crash_leaves_the_newest_versions_dirty() {
    let sb = chain_sb();
    let es = spread_chain_entries();
    let img = disk::build_image_epochs(&sb, CACHE_SECTORS, &es, epoch_fill);
    let m = disk::MemImage {
        name: "cache".into(),
        data: img.clone(),
    };
    let v = disk::survey(&m, &sb).unwrap().versions_to_write();
    let plan = plan_writeback(&v, 4096, MAX_WRITE_BYTES);
    let before = dirty_epochs(&img, &sb);
    assert_eq!(before[&5], [100, 101, 103]);
    assert_eq!(before[&6], [100, 101]);

    // Whole: every write touches one epoch's entries, and a sync comes
    // between two epochs and after the last.
    let all = RecDev::new("cache", img.clone(), usize::MAX);
    mark_clean(&all, &sb, &plan).unwrap();
    assert!(dirty_epochs(&all.data.borrow(), &sb).is_empty());
    let log = all.log.borrow().clone();
    let mut cur = img.clone();
    let mut epochs = vec![];
    for (off, data) in log.iter().flatten() {
        let o = *off as usize;
        let old = dirty_epochs(&cur, &sb);
        cur[o..o + data.len()].copy_from_slice(data);
        let new = dirty_epochs(&cur, &sb);
        let mut gone = vec![];
        for (b, es) in &old {
            let now = new.get(b).cloned().unwrap_or_default();
            gone.extend(es.iter().filter(|e| !now.contains(e)));
        }
        gone.sort();
        gone.dedup();
        assert_eq!(gone.len(), 1, "one write, one epoch: {gone:?}");
        epochs.push(gone[0]);
    }
    assert_power_cut_states(&all.shape(), &epochs);

    // Cut short after each write: a version still dirty is never older
    // than one marked clean (the module would load it as the newest).
    let writes = log.iter().flatten().count();
    for allow in 0..writes {
        let c = RecDev::new("cache", img.clone(), allow);
        assert!(mark_clean(&c, &sb, &plan).is_err());
        let left = dirty_epochs(&c.data.borrow(), &sb);
        for (b, was) in &before {
            let now = left.get(b).cloned().unwrap_or_default();
            let k = was.len() - now.len();
            assert_eq!(
                now,
                was[k..],
                "after {allow} writes, block {b}: dirty {now:?} of {was:?}: an older version dirty, a newer clean"
            );
        }
    }
}
