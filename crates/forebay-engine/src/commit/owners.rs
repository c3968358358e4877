//! Which checkpoints committed into an output directory, so that a checkpoint deleted
//! between runs (or another job's) does not silently write every row again beside the
//! files committed before.
//!
//! ```text
//!  <checkpoint>/_forebay_identity              made by the checkpoint's first run: its identity
//!  <output>/_forebay_checkpoints/<identity>    written before the first file a checkpoint
//!                                              publishes there (names the checkpoint's path)
//! ```
//!
//! A run opens its checkpoint and lists the output's marks. If other checkpoints committed
//! there and this one never did, the run stops before reading anything, unless it was told
//! the output is shared ([`Checkpoint::with_shared_output`]: two jobs writing one directory,
//! or a deliberate restart from scratch into the same output). A checkpoint deleted and made
//! again at the same path has a new identity, so the rerun is refused, not duplicated.
//!
//! A mark is written before the commit record that first publishes a file (one PUT per
//! run), so every published file's checkpoint has its mark: a kill between the two leaves a
//! mark without files, which at worst refuses another checkpoint that had nothing to fear.

use forebay_io::Dir;

use super::{changed_input_error, storage_err, Checkpoint};
use crate::error::Result;

/// A checkpoint's identity file (in its state directory).
const IDENTITY: &str = "_forebay_identity";
/// The output's directory of marks, one file per checkpoint that committed there.
const MARKS: &str = "_forebay_checkpoints";

/// The checkpoint's identity: read, or made now from `run_id` (unique to this run) when the
/// checkpoint has none (its first run, or its directory was deleted). Called under the
/// checkpoint's lock, so one run makes it.
pub(super) fn identity(state: &Dir, run_id: &str) -> Result<String> {
    if let Some(bytes) = state.get(IDENTITY).map_err(storage_err)? {
        let text = String::from_utf8_lossy(&bytes).trim().to_string();
        if is_identity(&text) {
            return Ok(text);
        }
        return Err(changed_input_error(format!(
            "{}: not a forebay checkpoint identity ({} bytes): the checkpoint's files were \
             changed by hand; start a new checkpoint",
            state.shown(IDENTITY),
            bytes.len()
        )));
    }
    state
        .put_atomic(IDENTITY, run_id.as_bytes().to_vec())
        .map_err(storage_err)?;
    Ok(run_id.to_string())
}

/// Refuse an output other checkpoints committed into when this one never did, unless the
/// checkpoint shares it. Returns whether this checkpoint's mark is there already.
pub(super) fn check_output(
    output: &Dir,
    identity: &str,
    checkpoint: &Checkpoint,
    state: &Dir,
) -> Result<bool> {
    let marks = output.list(MARKS).map_err(storage_err)?;
    if marks.iter().any(|m| m == identity) {
        return Ok(true);
    }
    let others: Vec<&String> = marks.iter().filter(|m| is_identity(m)).collect();
    if others.is_empty() || checkpoint.shares_output {
        return Ok(false);
    }
    let named: Vec<String> = others
        .iter()
        .take(3)
        .map(|m| {
            output
                .get(&format!("{MARKS}/{m}"))
                .ok()
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| (*m).clone())
        })
        .collect();
    Err(changed_input_error(format!(
        "the output {} holds files committed under another checkpoint ({}{}), and the \
         checkpoint {} has committed nothing there: if its directory was deleted since, this \
         run would write every row again beside them. Pass the checkpoint those files were \
         written with to resume, write to an empty output, or pass mode='append' to add this \
         job's rows to that output deliberately",
        output.root_uri(),
        named.join(", "),
        if others.len() > 3 { ", ..." } else { "" },
        state.root_uri(),
    )))
}

/// Mark the output as committed into by this checkpoint (before its first file publishes).
pub(super) fn mark_output(output: &Dir, identity: &str, state: &Dir) -> Result<()> {
    output
        .put_atomic(
            &format!("{MARKS}/{identity}"),
            state.root_uri().into_bytes(),
        )
        .map_err(storage_err)
}

/// What a run id looks like (`run_id`: two hex numbers): a mark of anything else in the
/// marks directory (a temporary file, a file put there by hand) is not a checkpoint's.
fn is_identity(text: &str) -> bool {
    let mut parts = text.split('-');
    let hex = |p: Option<&str>| {
        p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    hex(parts.next()) && hex(parts.next()) && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, Dir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let state = Dir::Local(tmp.path().join("ckpt"));
        let output = Dir::Local(tmp.path().join("out"));
        state.create().unwrap();
        output.create().unwrap();
        (tmp, state, output)
    }

    #[test]
    fn an_identity_is_made_once_and_read_back() {
        let (_tmp, state, _) = dirs();
        assert_eq!(identity(&state, "1a-2b").unwrap(), "1a-2b");
        assert_eq!(identity(&state, "3c-4d").unwrap(), "1a-2b");
        state.put_atomic(IDENTITY, b"garbage".to_vec()).unwrap();
        let err = identity(&state, "5e-6f").unwrap_err().to_string();
        assert!(err.contains("not a forebay checkpoint identity"), "{err}");
    }

    #[test]
    fn another_checkpoint_s_output_is_refused_unless_shared_and_its_own_is_not() {
        let (_tmp, state, output) = dirs();
        let checkpoint = Checkpoint::new("id", state.root_uri());
        assert!(!check_output(&output, "aa-1", &checkpoint, &state).unwrap());
        mark_output(&output, "aa-1", &state).unwrap();
        assert!(check_output(&output, "aa-1", &checkpoint, &state).unwrap());
        let err = check_output(&output, "bb-2", &checkpoint, &state)
            .unwrap_err()
            .to_string();
        assert!(err.contains("committed under another checkpoint"), "{err}");
        assert!(err.contains(&state.root_uri()), "{err}");
        let shared = checkpoint.with_shared_output(true);
        assert!(!check_output(&output, "bb-2", &shared, &state).unwrap());
        // A stray file among the marks is nobody's.
        output
            .put_atomic(&format!("{MARKS}/notes.txt"), b"x".to_vec())
            .unwrap();
        let (_tmp2, state2, output2) = dirs();
        output2
            .put_atomic(&format!("{MARKS}/notes.txt"), b"x".to_vec())
            .unwrap();
        let fresh = Checkpoint::new("id", state2.root_uri());
        assert!(!check_output(&output2, "cc-3", &fresh, &state2).unwrap());
    }
}
