// SPDX-License-Identifier: GPL-2.0-only
//! Errors with a stable exit code, a message naming the device, and a hint
//! saying what to do about it.

use std::fmt;

/// What went wrong, as far as a calling script is concerned.  The numeric
/// value is the process exit code and is part of the tool's interface
/// (documented in `tiercache --help` and userspace/README.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Anything not covered below: an ioctl or a helper command failed.
    Failure = 1,
    /// Bad command line: unknown option, bad value, bad combination.
    Usage = 2,
    /// A device, logical volume or configuration entry does not exist.
    NotFound = 3,
    /// A device is in use (mounted, open, held by another device) or a name
    /// is already taken.
    Busy = 4,
    /// Refused because dirty data would be lost or exposed.
    Dirty = 5,
    /// The target reported a writeback error (flush failed).
    FlushFailed = 6,
    /// A wait timed out.
    Timeout = 7,
    /// The kernel said something this tool does not understand (status or
    /// table line), or the target type is not available.
    Kernel = 8,
    /// The configuration file could not be read, parsed or written.
    Config = 9,
    /// A device (or image file) could not be opened, read or written.
    Unreadable = 10,
    /// The cache device holds no tiercache superblock (never formatted).
    NoSuperblock = 11,
    /// The superblock is corrupt, of an unknown version, or describes more
    /// than the device holds.
    BadSuperblock = 12,
    /// Metadata entries are corrupt.
    BadEntries = 13,
    /// Several committed dirty entries name the same origin block.
    DuplicateDirty = 14,
    /// The superblock is marked failed (TC_SB_FAILED): by the module when
    /// a metadata commit failed, or by `detach --abandon` (`check
    /// --mark-failed`) when an administrator gave the cache up.  The
    /// module does not load it again.
    SbFailed = 15,
    /// A question was not answered as asked (the device name for `detach
    /// --abandon`): nothing was changed.
    NotConfirmed = 16,
}

impl Kind {
    pub fn exit_code(self) -> i32 {
        self as i32
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    /// One line, normally starting with the name of the device concerned.
    pub msg: String,
    /// What the user can do about it.
    pub hint: Option<String>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Error {
            kind,
            msg: msg.into(),
            hint: None,
        }
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    /// The form printed on stderr: `tiercache: MSG` and `tiercache: hint: HINT`.
    pub fn report(&self) -> String {
        let mut s = format!("tiercache: {}\n", self.msg);
        if let Some(h) = &self.hint {
            s += &format!("tiercache: hint: {h}\n");
        }
        s
    }

    /// Prefix the message with the device (or other object) it concerns.
    pub fn context(mut self, what: &str) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

/// Shorthand constructors.
pub fn failure(msg: impl Into<String>) -> Error {
    Error::new(Kind::Failure, msg)
}
pub fn usage(msg: impl Into<String>) -> Error {
    Error::new(Kind::Usage, msg)
}
pub fn not_found(msg: impl Into<String>) -> Error {
    Error::new(Kind::NotFound, msg)
}
pub fn busy(msg: impl Into<String>) -> Error {
    Error::new(Kind::Busy, msg)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if let Some(h) = &self.hint {
            write!(f, "\nhint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Human name of an errno value, e.g. `EIO (Input/output error)`.
pub fn errno_name(errno: i32) -> String {
    let e = errno.abs();
    let sym = match e {
        1 => "EPERM",
        2 => "ENOENT",
        5 => "EIO",
        6 => "ENXIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        16 => "EBUSY",
        17 => "EEXIST",
        19 => "ENODEV",
        22 => "EINVAL",
        28 => "ENOSPC",
        30 => "EROFS",
        61 => "ENODATA",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        121 => "EREMOTEIO",
        _ => "",
    };
    let desc = std::io::Error::from_raw_os_error(e).to_string();
    // io::Error renders "Input/output error (os error 5)"; keep the text.
    let desc = desc.split(" (os error").next().unwrap_or("").to_string();
    if sym.is_empty() {
        format!("errno {e} ({desc})")
    } else {
        format!("{sym} ({desc})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_stable() {
        assert_eq!(Kind::Failure.exit_code(), 1);
        assert_eq!(Kind::Usage.exit_code(), 2);
        assert_eq!(Kind::NotFound.exit_code(), 3);
        assert_eq!(Kind::Busy.exit_code(), 4);
        assert_eq!(Kind::Dirty.exit_code(), 5);
        assert_eq!(Kind::FlushFailed.exit_code(), 6);
        assert_eq!(Kind::Timeout.exit_code(), 7);
        assert_eq!(Kind::Kernel.exit_code(), 8);
        assert_eq!(Kind::Config.exit_code(), 9);
        assert_eq!(Kind::Unreadable.exit_code(), 10);
        assert_eq!(Kind::NoSuperblock.exit_code(), 11);
        assert_eq!(Kind::BadSuperblock.exit_code(), 12);
        assert_eq!(Kind::BadEntries.exit_code(), 13);
        assert_eq!(Kind::DuplicateDirty.exit_code(), 14);
        assert_eq!(Kind::SbFailed.exit_code(), 15);
        assert_eq!(Kind::NotConfirmed.exit_code(), 16);
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(-5), "EIO (Input/output error)");
        assert_eq!(errno_name(28), "ENOSPC (No space left on device)");
        assert!(errno_name(-200).starts_with("errno 200"));
    }

    #[test]
    fn display_with_hint() {
        let e = busy("slow: device is open").hint("unmount it first");
        assert_eq!(
            e.to_string(),
            "slow: device is open\nhint: unmount it first"
        );
    }
}
