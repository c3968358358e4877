//! What the protocol writes down, as JSON: a commit's record (the decision), the inputs
//! snapshot earlier runs folded their records into, and the finished inputs a scan skips.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use forebay_parquet::{FileEntry, ScanSkip};
use serde::{Deserialize, Serialize};

use super::{corrupt, storage_err, FORMAT, INPUTS};
use crate::error::{EngineError, Result};
use crate::positions::PositionRanges;
use forebay_io::Dir;

/// An identity of an input file, to notice that it changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) size: u64,
    pub(super) modified_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) e_tag: Option<String>,
}

impl Identity {
    pub(super) fn of(entry: &FileEntry) -> Identity {
        Identity {
            size: entry.size(),
            modified_ms: entry.last_modified_ms(),
            e_tag: entry.e_tag().map(str::to_string),
        }
    }

    /// Same file: same size, and the same entity tag when both have one (else the same
    /// modification time).
    pub(super) fn same_as(&self, other: &Identity) -> bool {
        self.size == other.size
            && match (&self.e_tag, &other.e_tag) {
                (Some(a), Some(b)) => a == b,
                _ => self.modified_ms == other.modified_ms,
            }
    }
}

/// What earlier runs finished of one input file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct InputState {
    #[serde(flatten)]
    pub(super) identity: Identity,
    #[serde(default)]
    pub(super) complete: bool,
    #[serde(default)]
    pub(super) row_groups: BTreeSet<usize>,
    /// Positions consumed in row groups not finished (see `positions`), by row group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) consumed: BTreeMap<usize, PositionRanges>,
}

impl InputState {
    pub(super) fn new(identity: Identity) -> InputState {
        InputState {
            identity,
            complete: false,
            row_groups: BTreeSet::new(),
            consumed: BTreeMap::new(),
        }
    }

    /// Add what a commit recorded of this input.
    pub(super) fn fold(&mut self, input: &InputRecord) {
        self.complete |= input.complete;
        self.row_groups.extend(input.row_groups.iter().copied());
        for (row_group, ranges) in &input.consumed {
            self.consumed.entry(*row_group).or_default().extend(ranges);
        }
        // A finished file is skipped whole: its row groups and positions say nothing more
        // (and would cost every fold of a 100,000-file job bytes to rewrite).
        if self.complete {
            self.row_groups.clear();
            self.consumed.clear();
        }
        let finished = &self.row_groups;
        self.consumed.retain(|rg, _| !finished.contains(rg));
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct InputsSnapshot {
    pub(super) format: u32,
    /// The scan filter (`read_parquet(filter=...)`, as text) the inputs were finished
    /// under: a file finished under one filter may hold rows another one keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) scan_filter: Option<String>,
    /// Every commit folded in recorded the positions it consumed (see `positions`): a
    /// resume needs no probe by id. False for snapshots written before positions, and once
    /// a commit without them (forebay.ray's, of rows that lost their tags) is folded in.
    #[serde(default)]
    pub(super) positions: bool,
    /// Ids published by the commits folded in.
    #[serde(default)]
    pub(super) ids: u64,
    /// Input rows the commits folded in account for (see [`CommitRecord::input_rows`]),
    /// under the current scan filter: what a `limit()` of the job has used up. None once a
    /// commit that did not count them is folded in (or in a snapshot of an older forebay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) input_rows: Option<u64>,
    pub(super) files: BTreeMap<String, InputState>,
    /// The commits whose records the fold that wrote this snapshot folded in. A kill
    /// before their record files were deleted leaves them behind: the next fold deletes
    /// them without folding them again (a record folded twice would count its ids twice,
    /// and an old record's scan filter would undo a newer one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) folded: Vec<String>,
}

impl InputsSnapshot {
    /// Add what a commit recorded.
    pub(super) fn fold(&mut self, record: &CommitRecord) {
        if record.scan_filter != self.scan_filter {
            // A run under another filter. What was finished with no filter stays finished
            // (every row was read); what was finished under another filter is not finished
            // under this one, and is read again.
            if self.scan_filter.is_some() {
                self.files.clear();
            }
            // Positions count the rows a filter keeps: under another one they name other
            // rows.
            for state in self.files.values_mut() {
                state.consumed.clear();
            }
            self.scan_filter = record.scan_filter.clone();
            // Another filter is another job: its rows are counted from here.
            self.input_rows = Some(0);
        }
        self.input_rows = self.input_rows.zip(record.input_rows).map(|(a, b)| a + b);
        let ids = record.ids.as_ref().map_or(0, |i| i.count);
        self.ids += ids;
        if ids > 0 && !record.positions {
            // Rows this record published are known only by id from now on.
            self.positions = false;
        }
        for input in &record.inputs {
            let entry = self
                .files
                .entry(input.uri.clone())
                .or_insert_with(|| InputState::new(input.identity.clone()));
            if !entry.identity.same_as(&input.identity) {
                // Recorded again after it changed (reprocess): the new identity wins.
                *entry = InputState::new(input.identity.clone());
            }
            entry.fold(input);
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DataFileRecord {
    pub staged: String,
    #[serde(rename = "final")]
    pub final_name: String,
    pub rows: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct IdPartsRecord {
    /// Relative to the checkpoint directory's staging directory of this commit.
    pub parts: Vec<String>,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct InputRecord {
    pub(super) uri: String,
    #[serde(flatten)]
    pub(super) identity: Identity,
    #[serde(default)]
    pub(super) complete: bool,
    #[serde(default)]
    pub(super) row_groups: Vec<usize>,
    /// Positions this commit consumed in row groups it does not finish.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) consumed: BTreeMap<usize, PositionRanges>,
}

/// The decision of one commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct CommitRecord {
    pub(super) format: u32,
    pub(super) commit: String,
    pub(super) data: Option<DataFileRecord>,
    /// Files of rows set aside by `map_batches(on_error="dead_letter")` (see
    /// `dead_letter`), in the output directory like `data`, published with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) dead_letters: Vec<DataFileRecord>,
    pub(super) ids: Option<IdPartsRecord>,
    pub(super) inputs: Vec<InputRecord>,
    /// The run's scan filter (see [`InputsSnapshot`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) scan_filter: Option<String>,
    /// The run recorded the positions its commits consumed (`inputs[].consumed`).
    #[serde(default)]
    pub(super) positions: bool,
    /// Input rows this commit accounts for: rows the scan emitted (after its filter) that
    /// went into its files, its dead letters, or that a map turned into nothing. A resumed
    /// `limit(n)` passes only the rows the commits have not accounted for. None: not
    /// counted (a forebay.ray commit of rows without positions, an older forebay's record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) input_rows: Option<u64>,
}

impl CommitRecord {
    /// The files it publishes in the output directory: its data file, then its dead letters.
    pub(super) fn output_files(&self) -> impl Iterator<Item = &DataFileRecord> {
        self.data.iter().chain(&self.dead_letters)
    }
}

/// The input files and row groups earlier runs finished, by URI: the scan skips them.
/// Serialisable, so that readers in other processes (Ray read tasks) skip the same.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FinishedInputs(pub(super) HashMap<String, InputState>);

impl FinishedInputs {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("finished inputs serialise")
    }

    pub fn from_json(text: &str) -> Result<FinishedInputs> {
        serde_json::from_str(text).map_err(|e| {
            EngineError::InvalidArgument(format!("not a list of finished inputs: {e}"))
        })
    }

    /// Only the entries of these files (what one reader of a subset needs).
    pub fn subset<'a>(&self, uris: impl IntoIterator<Item = &'a str>) -> FinishedInputs {
        FinishedInputs(
            uris.into_iter()
                .filter_map(|u| self.0.get(u).map(|s| (u.to_string(), s.clone())))
                .collect(),
        )
    }

    /// The positions earlier commits consumed in a row group not finished.
    pub(crate) fn consumed(&self, uri: &str, row_group: usize) -> Option<&PositionRanges> {
        self.0.get(uri).and_then(|s| s.consumed.get(&row_group))
    }

    /// Files recorded as complete.
    pub fn complete_files(&self) -> usize {
        self.0.values().filter(|s| s.complete).count()
    }
}

impl ScanSkip for FinishedInputs {
    fn skip_file(&self, file: &FileEntry) -> bool {
        self.0.get(file.uri()).is_some_and(|s| s.complete)
    }
    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool {
        self.0
            .get(file.uri())
            .is_some_and(|s| s.complete || s.row_groups.contains(&row_group))
    }
}

pub(super) fn load_inputs(state: &Dir) -> Result<InputsSnapshot> {
    match state.get(INPUTS).map_err(storage_err)? {
        None => Ok(InputsSnapshot {
            format: FORMAT,
            scan_filter: None,
            positions: true,
            ids: 0,
            input_rows: Some(0),
            files: BTreeMap::new(),
            folded: Vec::new(),
        }),
        Some(bytes) => {
            let mut snapshot: InputsSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                corrupt(state.shown(INPUTS), format!("not an inputs snapshot: {e}"))
            })?;
            if snapshot.format != FORMAT {
                return Err(corrupt(
                    state.shown(INPUTS),
                    format!("format {} (this forebay reads {FORMAT})", snapshot.format),
                ));
            }
            if snapshot.input_rows.is_none() && snapshot.files.is_empty() && snapshot.ids == 0 {
                // An older forebay's snapshot of nothing done: nothing to count.
                snapshot.input_rows = Some(0);
            }
            Ok(snapshot)
        }
    }
}
