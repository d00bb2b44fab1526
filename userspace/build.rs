// SPDX-License-Identifier: GPL-2.0-only
//! The on-disk format of the cache device is defined once, in the module's
//! dm-tiercache/tc_disk.h, and implemented once, in dm-tiercache/tc_disk.c.
//! This build script compiles that same C file into the tool and generates
//! the Rust view of the header's structures, constants and enums with
//! bindgen, so the tool decodes metadata with exactly the module's code.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let src = manifest.join("../dm-tiercache");
    let header = src.join("tc_disk.h");
    let code = src.join("tc_disk.c");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed={}", code.display());

    let abi = manifest.join("csrc/tc_disk_abi.c");
    println!("cargo:rerun-if-changed={}", abi.display());

    // tc_disk_abi.c too: it wraps the header's inline functions, which
    // bindgen does not bind.
    cc::Build::new()
        .file(&code)
        .file(&abi)
        .include(&src)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("tc_disk");

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .header(abi.to_string_lossy())
        .clang_arg(format!("-I{}", src.display()))
        .allowlist_type("tc_.*")
        .allowlist_function("tc_.*")
        .allowlist_var("TC_.*")
        .allowlist_var("tc_abi_.*")
        // The header's kernel-style typedefs (u8, u32, __le64, ...) would
        // shadow Rust's primitive names: use the primitives directly.
        .blocklist_type("u8|u16|u32|u64|__u8|__le32|__le64")
        .raw_line("#[allow(non_camel_case_types)] type u8 = core::primitive::u8;")
        .raw_line("#[allow(non_camel_case_types)] type u16 = core::primitive::u16;")
        .raw_line("#[allow(non_camel_case_types)] type u32 = core::primitive::u32;")
        .raw_line("#[allow(non_camel_case_types)] type u64 = core::primitive::u64;")
        .raw_line("#[allow(non_camel_case_types)] type __u8 = core::primitive::u8;")
        .raw_line("#[allow(non_camel_case_types)] type __le32 = core::primitive::u32;")
        .raw_line("#[allow(non_camel_case_types)] type __le64 = core::primitive::u64;")
        .newtype_enum("tc_sb_result|tc_de_result|tc_sum_result")
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen: cannot generate bindings for dm-tiercache/tc_disk.h (is libclang-dev installed?)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("tc_disk.rs");
    bindings
        .write_to_file(&out)
        .expect("cannot write the tc_disk bindings");
}
