// SPDX-License-Identifier: GPL-2.0-only
//! Library behind the `tiercache` command: everything except argument
//! parsing.  The device-mapper, LVM and host layers are traits (`dm::Dm`,
//! `lvm::Lvm`, `host::Host`) so that the parsers and the command logic are
//! tested on the host with `cargo test`, without a kernel.

pub mod config;
pub mod disk;
pub mod dm;
pub mod error;
pub mod host;
pub mod lvm;
pub mod meta;
pub mod ops;
pub mod progress;
pub mod status;
pub mod table;
pub mod units;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod ops_tests;
