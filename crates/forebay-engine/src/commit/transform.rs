//! Which transform a checkpoint's rows came from, so that a rerun with another model or
//! prompt does not skip the rows the old one wrote and mix two models in one output.
//!
//! ```text
//!  <checkpoint>/_forebay_transform.json   [{"step": 0, "name": "map_batches(Embed)",
//!                                           "fingerprint": "embed-v2"}, ...]
//! ```
//!
//! A map step's fingerprint is what its user says identifies it (`MapStage::with_fingerprint`:
//! a model name and version, a prompt template's hash, its parameters); steps without one
//! are not compared. A run records its steps' fingerprints when it opens the checkpoint. A
//! later run compares: the same fingerprints at the same steps resume; any other is refused
//! before anything is read, naming each step that changed, unless the checkpoint holds no
//! committed row yet (then the record is replaced). Names are shown in the error, not
//! compared: renaming a function changes nothing.

use forebay_io::Dir;
use serde::{Deserialize, Serialize};

use super::{changed_input_error, storage_err};
use crate::error::Result;

/// The record of a checkpoint's transform (in its state directory).
const TRANSFORM: &str = "_forebay_transform.json";

/// One map step's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StepFingerprint {
    /// The step's index among the pipeline's map steps.
    pub(crate) step: usize,
    /// Its name, for messages.
    pub(crate) name: String,
    pub(crate) fingerprint: String,
}

/// Check `now` against the transform the checkpoint recorded, and record `now` when there
/// is no record, it differs only where nothing was committed, or it holds fewer steps'
/// fingerprints that all agree (fingerprints added to a job that had none).
pub(super) fn check_transform(
    state: &Dir,
    now: &[StepFingerprint],
    committed_anything: bool,
) -> Result<()> {
    let recorded: Option<Vec<StepFingerprint>> = match state.get(TRANSFORM).map_err(storage_err)? {
        None => None,
        Some(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
            changed_input_error(format!(
                "{}: not a forebay transform record ({e}): the checkpoint's files were changed \
                 by hand; start a new checkpoint",
                state.shown(TRANSFORM)
            ))
        })?),
    };
    if let (Some(recorded), true) = (&recorded, committed_anything) {
        let changed = differences(recorded, now);
        if !changed.is_empty() {
            return Err(changed_input_error(format!(
                "the checkpoint {} holds rows written by another transform: {}. Resuming \
                 would keep those rows and write the rest with the new one, two transforms \
                 mixed in one output: write to a new output with a new checkpoint, or rerun \
                 with the fingerprint the checkpoint recorded",
                state.root_uri(),
                changed.join("; ")
            )));
        }
    }
    // A job that never gave a fingerprint leaves no record.
    let nothing_to_record = recorded.is_none() && now.is_empty();
    if recorded.as_deref() != Some(now) && !nothing_to_record {
        let bytes = serde_json::to_vec_pretty(now).expect("fingerprints serialise");
        state.put_atomic(TRANSFORM, bytes).map_err(storage_err)?;
    }
    Ok(())
}

/// What differs between the recorded fingerprints and this run's, step by step. A step
/// with a fingerprint on one side only differs too, except that a record with none at all
/// (a job that gave none before) accepts any.
fn differences(recorded: &[StepFingerprint], now: &[StepFingerprint]) -> Vec<String> {
    if recorded.is_empty() {
        return Vec::new();
    }
    let steps: std::collections::BTreeSet<usize> =
        recorded.iter().chain(now).map(|s| s.step).collect();
    let find = |side: &[StepFingerprint], step| side.iter().find(|s| s.step == step).cloned();
    steps
        .into_iter()
        .filter_map(|step| {
            let (was, is) = (find(recorded, step), find(now, step));
            let name = is
                .as_ref()
                .or(was.as_ref())
                .map(|s| s.name.clone())
                .unwrap_or_default();
            let shown = |s: &Option<StepFingerprint>| match s {
                Some(s) => format!("{:?}", s.fingerprint),
                None => "none".to_string(),
            };
            (was.as_ref().map(|s| &s.fingerprint) != is.as_ref().map(|s| &s.fingerprint)).then(
                || {
                    format!(
                        "map step {step} ({name}) has fingerprint {} now, {} when the \
                         checkpoint's rows were written",
                        shown(&is),
                        shown(&was)
                    )
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: usize, fingerprint: &str) -> StepFingerprint {
        StepFingerprint {
            step,
            name: format!("map_batches(f{step})"),
            fingerprint: fingerprint.into(),
        }
    }

    #[test]
    fn the_same_fingerprints_resume_and_another_is_refused_once_rows_are_committed() {
        let tmp = tempfile::tempdir().unwrap();
        let state = Dir::Local(tmp.path().to_path_buf());
        let v1 = [step(0, "embed-v1")];
        let v2 = [step(0, "embed-v2")];
        check_transform(&state, &v1, false).unwrap();
        // Nothing committed yet: another transform replaces the record.
        check_transform(&state, &v2, false).unwrap();
        check_transform(&state, &v2, true).unwrap();
        let err = check_transform(&state, &v1, true).unwrap_err().to_string();
        assert!(
            err.contains(
                "map step 0 (map_batches(f0)) has fingerprint \"embed-v1\" now, \"embed-v2\""
            ),
            "{err}"
        );
        // A fingerprint dropped, or given to another step, is a change too.
        let err = check_transform(&state, &[], true).unwrap_err().to_string();
        assert!(err.contains("fingerprint none now"), "{err}");
        let err = check_transform(&state, &[step(1, "embed-v2")], true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("map step 0") && err.contains("map step 1"),
            "{err}"
        );
        // The record still says v2.
        check_transform(&state, &v2, true).unwrap();
    }

    #[test]
    fn a_job_that_gave_no_fingerprint_may_start_giving_one() {
        let tmp = tempfile::tempdir().unwrap();
        let state = Dir::Local(tmp.path().to_path_buf());
        check_transform(&state, &[], true).unwrap();
        check_transform(&state, &[step(0, "v1")], true).unwrap();
        assert!(check_transform(&state, &[step(0, "v2")], true).is_err());
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let state = Dir::Local(tmp.path().to_path_buf());
        state.put_atomic(TRANSFORM, b"{not json".to_vec()).unwrap();
        let err = check_transform(&state, &[], true).unwrap_err().to_string();
        assert!(
            err.contains("_forebay_transform.json") && err.contains("by hand"),
            "{err}"
        );
    }
}
