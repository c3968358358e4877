//! What a scan charges to a host's memory pool
//! ([`with_memory_pool`](super::ParquetDatasetBuilder::with_memory_pool)).
//!
//! ```text
//!  unit planned ──► charge(unit) = compressed column chunks + decoded estimate (footer)
//!                     │ pool grants ──► fetch, decode
//!                     │ pool refuses ─► wait for the oldest unit in flight to be handed on
//!                     │                 (nothing in flight: MemoryRefused, the scan ends)
//!  unit's batches all forwarded ──► release its charge
//!  scan ends or is dropped ───────► the reservation gives back everything, unregisters
//! ```
//!
//! Charges are estimates from the footer, made before any byte is requested: a unit never
//! holds more than its compressed chunks plus its decoded batches.

use std::collections::VecDeque;

use forebay_io::memory::{MemoryPool, MemoryReservation};
use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::ColumnChunkMetaData;
use std::sync::Arc;

use super::{DatasetInner, OpenedFile, Unit};
use crate::error::ParquetError;

/// What decoding a column chunk takes in memory, roughly: a value's width per value for
/// fixed-width types (however well they compressed or dictionary-encoded); for byte arrays
/// the uncompressed size, at least a view (16 bytes) per value.
pub(super) fn decoded_bytes_estimate(chunk: &ColumnChunkMetaData) -> u64 {
    let values = chunk.num_values().max(0) as u64;
    let width = match chunk.column_type() {
        PhysicalType::BOOLEAN => return values.div_ceil(8),
        PhysicalType::INT32 | PhysicalType::FLOAT => 4,
        PhysicalType::INT64 | PhysicalType::DOUBLE | PhysicalType::INT96 => 8,
        PhysicalType::FIXED_LEN_BYTE_ARRAY => chunk.column_descr().type_length().max(1) as u64,
        PhysicalType::BYTE_ARRAY => {
            return (chunk.uncompressed_size().max(0) as u64).max(values * 16)
        }
    };
    values * width
}

/// What reading `unit` holds at most: its selected column chunks as fetched, and the
/// batches decoded from them.
fn unit_bytes(file: &OpenedFile, unit: &Unit) -> usize {
    let footer = file.reader_meta.metadata();
    let Some(group) = footer.row_groups().get(unit.row_group) else {
        return 0;
    };
    group
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| file.projection.leaf_included(*leaf))
        .map(|(_, c)| c.compressed_size().max(0) as u64 + decoded_bytes_estimate(c))
        .sum::<u64>() as usize
}

/// Whether a unit may start now.
pub(super) enum Admission {
    /// Charged (or no pool): start it.
    Granted(usize),
    /// The pool refused while other units are in flight: try again after one is handed on.
    Wait,
    /// The pool refused with nothing of the scan in flight.
    Refused(ParquetError),
}

/// A scan's reservation and the charge of each unit in flight, oldest first.
pub(super) struct Charges {
    reservation: Option<MemoryReservation>,
    in_flight: VecDeque<usize>,
}

impl Charges {
    pub(super) fn new(inner: &DatasetInner) -> Self {
        let name = match inner.files.first() {
            Some(f) => format!("forebay scan of {}", f.uri),
            None => "forebay scan".to_string(),
        };
        Charges {
            reservation: inner
                .options
                .memory_pool
                .clone()
                .map(|pool: Arc<dyn MemoryPool>| MemoryReservation::new(pool, name)),
            in_flight: VecDeque::new(),
        }
    }

    /// Ask the pool for what `unit` will hold (`nothing_held`: no unit of the scan is in
    /// flight or charged ahead, so waiting would free nothing).
    pub(super) fn admit(
        &mut self,
        file: &OpenedFile,
        unit: &Unit,
        nothing_held: bool,
    ) -> Admission {
        let Some(reservation) = &mut self.reservation else {
            return Admission::Granted(0);
        };
        let bytes = unit_bytes(file, unit);
        match reservation.try_grow(bytes) {
            Ok(()) => Admission::Granted(bytes),
            Err(_) if !nothing_held => Admission::Wait,
            Err(source) => Admission::Refused(ParquetError::MemoryRefused {
                path: unit.file.to_string(),
                row_group: unit.row_group,
                bytes,
                source,
            }),
        }
    }

    /// A unit charged `bytes` (by [`admit`](Self::admit)) is now in flight, the newest.
    pub(super) fn started(&mut self, bytes: usize) {
        self.in_flight.push_back(bytes);
    }

    /// The oldest unit in flight has handed on all its batches.
    pub(super) fn finished_oldest(&mut self) {
        let bytes = self.in_flight.pop_front().unwrap_or(0);
        self.release(bytes);
    }

    /// Give back the charge of a unit that will not start now.
    pub(super) fn release(&mut self, bytes: usize) {
        if let Some(reservation) = &mut self.reservation {
            reservation.shrink(bytes);
        }
    }
}
