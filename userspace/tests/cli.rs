// SPDX-License-Identifier: GPL-2.0-only
//! Golden tests of the command line: --help texts, bad options and values.
//! These never reach device-mapper, so they run anywhere.

use std::path::PathBuf;
use std::process::Command;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// stdout, stderr and exit status in one text.
fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .env_remove("TIERCACHE_CONFIG")
        .env("LC_ALL", "C")
        .output()
        .expect("run tiercache");
    format!(
        "{}[stderr]\n{}[exit {}]\n",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status.code().unwrap_or(-1)
    )
}

#[test]
fn golden_cases() {
    let cases = std::fs::read_to_string(golden_dir().join("cases.txt")).unwrap();
    let update = std::env::var("UPDATE_GOLDEN").is_ok();
    let mut failed = vec![];
    let mut n = 0;
    for line in cases.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, args) = line.split_once('|').expect("name | args");
        let name = name.trim();
        let args: Vec<&str> = args.split_whitespace().collect();
        let got = run(&args);
        let path = golden_dir().join(format!("{name}.out"));
        n += 1;
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if got != want {
            failed.push(format!(
                "--- {name} (tiercache {}):\nwant:\n{want}\ngot:\n{got}",
                args.join(" ")
            ));
        }
    }
    assert!(n > 20);
    assert!(
        failed.is_empty(),
        "{} golden case(s) differ:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "create",
        "remove",
        "status",
        "flush",
        "set",
        "list",
        "attach",
        "detach",
        "activate",
        "deactivate",
        "check",
        "dump",
        "writeback",
    ] {
        let o = run(&[sub, "--help"]);
        assert!(o.contains("Usage: tiercache"), "{sub}: {o}");
        assert!(o.ends_with("[exit 0]\n"), "{sub}: {o}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["create", "x"][..],
        &["bogus"],
        &["flush", "c", "--timeout", "3"],
    ] {
        let o = run(args);
        assert!(o.ends_with("[exit 2]\n"), "{args:?}: {o}");
    }
}
