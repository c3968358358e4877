//! The wire protocol between an attached process and the owner, over the store's Unix
//! socket. Requests and replies are small binary frames; object bytes never travel over
//! the socket (both sides map the arena).
//!
//! ```text
//! request: op u8 | 3 zero | payload_len u32 | payload
//! reply:   status u8 (0 ok, else an ErrorKind) | 3 zero | payload_len u32 | payload
//!          (error payload: the owner's error message, UTF-8)
//! ```
//!
//! `Unpin` and `Abort` have no reply, so releasing a view never waits for the owner.

use std::io::{self, Read, Write};

use crate::error::ErrorKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Hello = 1,
    Create = 2,
    Seal = 3,
    Abort = 4,
    Pin = 5,
    Unpin = 6,
    Delete = 7,
    Contains = 8,
    Stats = 9,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Hello,
            2 => Op::Create,
            3 => Op::Seal,
            4 => Op::Abort,
            5 => Op::Pin,
            6 => Op::Unpin,
            7 => Op::Delete,
            8 => Op::Contains,
            9 => Op::Stats,
            _ => return None,
        })
    }

    pub fn has_reply(self) -> bool {
        !matches!(self, Op::Unpin | Op::Abort)
    }
}

/// Largest payload either side accepts (requests and replies are tiny; this bounds what a
/// confused peer can make us allocate).
const MAX_PAYLOAD: u32 = 1 << 16;

/// Write one frame (`tag` = op or status) in a single write.
pub fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.push(tag);
    frame.extend_from_slice(&[0; 3]);
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    w.write_all(&frame)
}

/// Read one frame; `Ok(None)` at a clean end of stream before a frame starts.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 8];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(head[4..8].try_into().unwrap());
    if len > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame payload of {len} bytes exceeds the protocol limit"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// Little-endian field reader over a payload; `None` when the payload is too short.
pub struct Fields<'a>(pub &'a [u8]);

impl Fields<'_> {
    pub fn u8(&mut self) -> Option<u8> {
        let (&v, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(v)
    }
    pub fn u64(&mut self) -> Option<u64> {
        let (head, rest) = self.0.split_at_checked(8)?;
        self.0 = rest;
        Some(u64::from_le_bytes(head.try_into().ok()?))
    }
    pub fn u128(&mut self) -> Option<u128> {
        let (head, rest) = self.0.split_at_checked(16)?;
        self.0 = rest;
        Some(u128::from_le_bytes(head.try_into().ok()?))
    }
}

pub fn error_status(kind: ErrorKind) -> u8 {
    kind as u8
}

pub fn error_kind(status: u8) -> ErrorKind {
    match status {
        1 => ErrorKind::NotFound,
        2 => ErrorKind::NotSealed,
        3 => ErrorKind::Full,
        4 => ErrorKind::TooLarge,
        _ => ErrorKind::Other,
    }
}
