use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use super::records::{load_inputs, CommitRecord, Identity, InputRecord};
use super::recovery::{recover, recover_skipping};
use super::*;
use forebay_io::Dir;

fn dirs() -> (tempfile::TempDir, Dir, Dir) {
    dirs_on("local")
}

/// A checkpoint and an output directory on `kind`: "local", or "memory" (an object
/// store: no rename, publishing is copy + delete).
fn dirs_on(kind: &str) -> (tempfile::TempDir, Dir, Dir) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = tempfile::tempdir().unwrap();
    let (state, output) = match kind {
        "local" => (
            Dir::Local(tmp.path().join("ckpt")),
            Dir::Local(tmp.path().join("out")),
        ),
        _ => {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let open = |name: &str| {
                Dir::open(
                    &format!("memory://commit-tests-{n}/{name}"),
                    &Default::default(),
                )
                .unwrap()
            };
            (open("ckpt"), open("out"))
        }
    };
    state.create().unwrap();
    output.create().unwrap();
    (tmp, state, output)
}

/// A record of commit `commit` of the checkpoint `state`, its files staged where
/// `output_staging` puts them.
fn record(state: &Dir, commit: &str) -> CommitRecord {
    let staging = output_staging(state);
    CommitRecord {
        format: FORMAT,
        commit: commit.into(),
        data: Some(DataFileRecord {
            staged: format!("{staging}/part-{commit}.parquet"),
            final_name: format!("part-{commit}.parquet"),
            rows: 3,
            bytes: 4,
        }),
        dead_letters: vec![DataFileRecord {
            staged: format!("{staging}/_dead_letter/f/part-{commit}.parquet"),
            final_name: format!("_dead_letter/f/part-{commit}.parquet"),
            rows: 1,
            bytes: 2,
        }],
        ids: Some(IdPartsRecord {
            parts: vec![format!("shard=1/part-{commit}.parquet")],
            count: 3,
        }),
        inputs: vec![InputRecord {
            uri: "/in/a.parquet".into(),
            identity: Identity {
                size: 10,
                modified_ms: 5,
                e_tag: None,
            },
            complete: false,
            row_groups: vec![2, 0],
            consumed: Default::default(),
        }],
        scan_filter: None,
        positions: true,
        input_rows: Some(4),
    }
}

fn stage(state: &Dir, output: &Dir, commit: &str) {
    let staging = output_staging(state);
    output
        .put_atomic(
            &format!("{staging}/part-{commit}.parquet"),
            b"data".to_vec(),
        )
        .unwrap();
    output
        .put_atomic(
            &format!("{staging}/_dead_letter/f/part-{commit}.parquet"),
            b"dead".to_vec(),
        )
        .unwrap();
    state
        .put_atomic(
            &format!("{STAGING}/{commit}/shard=1/part-{commit}.parquet"),
            b"ids".to_vec(),
        )
        .unwrap();
}

#[test]
fn a_recorded_commit_is_rolled_forward() {
    for kind in ["local", "memory"] {
        rolled_forward_on(kind);
    }
}

fn rolled_forward_on(kind: &str) {
    let (_tmp, state, output) = dirs_on(kind);
    stage(&state, &output, "c1");
    let bytes = serde_json::to_vec(&record(&state, "c1")).unwrap();
    state
        .put_atomic(&format!("{COMMITS}/c1.json"), bytes)
        .unwrap();
    // Killed after the record, before publishing: recovery publishes all three.
    assert_eq!(recover(&state, &output).unwrap(), 1);
    assert_eq!(
        output.get("part-c1.parquet").unwrap().unwrap().as_ref(),
        b"data"
    );
    assert_eq!(
        output
            .get("_dead_letter/f/part-c1.parquet")
            .unwrap()
            .unwrap()
            .as_ref(),
        b"dead"
    );
    assert_eq!(
        state
            .get("shard=1/part-c1.parquet")
            .unwrap()
            .unwrap()
            .as_ref(),
        b"ids"
    );
    assert!(
        state.list(COMMITS).unwrap().is_empty(),
        "records folded into the snapshot"
    );
    assert!(!state.exists(STAGING).unwrap());
    assert!(!output.exists(&output_staging(&state)).unwrap());
    let snapshot = load_inputs(&state).unwrap();
    assert_eq!(
        snapshot.files["/in/a.parquet"].row_groups,
        BTreeSet::from([0, 2])
    );
    // Recovering again changes nothing (idempotent).
    assert_eq!(recover(&state, &output).unwrap(), 0);
    assert!(output.exists("part-c1.parquet").unwrap());
}

/// Two jobs, each with its own checkpoint, writing into one output directory: the
/// recovery of one never deletes what the other staged, whether the other is killed with
/// a commit recorded but not published, or still running (a file staged, not recorded).
#[test]
fn jobs_sharing_an_output_directory_stage_apart() {
    for kind in ["local", "memory"] {
        let (_tmp, state_a, output) = dirs_on(kind);
        let (_tmp_b, state_b, _) = dirs_on(kind);
        assert_ne!(output_staging(&state_a), output_staging(&state_b));
        // Job A: commit c1 recorded, killed before publishing; c2 staged only (running).
        stage(&state_a, &output, "c1");
        let bytes = serde_json::to_vec(&record(&state_a, "c1")).unwrap();
        state_a
            .put_atomic(&format!("{COMMITS}/c1.json"), bytes)
            .unwrap();
        stage(&state_a, &output, "c2");
        // Job B starts (recovers) in the same output directory.
        assert_eq!(recover(&state_b, &output).unwrap(), 0);
        let staged_a = format!("{}/part-c2.parquet", output_staging(&state_a));
        assert!(
            output.exists(&staged_a).unwrap(),
            "A's running commit untouched"
        );
        // A resumes: its recorded commit rolls forward.
        assert_eq!(recover(&state_a, &output).unwrap(), 1);
        assert_eq!(
            output.get("part-c1.parquet").unwrap().unwrap().as_ref(),
            b"data"
        );
        assert!(
            !output.exists(&staged_a).unwrap(),
            "A's own unrecorded file rolled back"
        );
    }
}

/// A record of a forebay that staged every job's files in the output's shared
/// `_forebay_staging/` still rolls forward.
#[test]
fn a_record_staged_in_the_shared_staging_directory_rolls_forward() {
    for kind in ["local", "memory"] {
        let (_tmp, state, output) = dirs_on(kind);
        let mut legacy = record(&state, "c9");
        legacy.dead_letters.clear();
        let data = legacy.data.as_mut().unwrap();
        data.staged = format!("{STAGING}/part-c9.parquet");
        output.put_atomic(&data.staged, b"legacy".to_vec()).unwrap();
        state
            .put_atomic(
                &format!("{STAGING}/c9/shard=1/part-c9.parquet"),
                b"ids".to_vec(),
            )
            .unwrap();
        let bytes = serde_json::to_vec(&legacy).unwrap();
        state
            .put_atomic(&format!("{COMMITS}/c9.json"), bytes)
            .unwrap();
        assert_eq!(recover(&state, &output).unwrap(), 1, "{kind}");
        assert_eq!(
            output.get("part-c9.parquet").unwrap().unwrap().as_ref(),
            b"legacy"
        );
    }
}

/// A commit as a run makes it (files staged, record written), killed before publishing,
/// then recovered: rolled forward and folded into the inputs snapshot.
fn recorded_then_recovered(state: &Dir, output: &Dir, record: &CommitRecord) {
    stage(state, output, &record.commit);
    let bytes = serde_json::to_vec(record).unwrap();
    state
        .put_atomic(&format!("{COMMITS}/{}.json", record.commit), bytes)
        .unwrap();
    recover(state, output).unwrap();
}

/// A record of run 2, under filter `B`, finishing row group 1 of another file.
fn under_filter_b(state: &Dir, commit: &str) -> CommitRecord {
    let mut record = record(state, commit);
    record.scan_filter = Some("B".into());
    record.inputs[0].uri = "/in/b.parquet".into();
    record.inputs[0].row_groups = vec![1];
    record
}

#[test]
fn inputs_finished_under_another_scan_filter_are_not_kept() {
    let (_tmp, state, output) = dirs();
    let mut first = record(&state, "c1");
    first.scan_filter = Some("A".into());
    recorded_then_recovered(&state, &output, &first);
    assert_eq!(
        load_inputs(&state).unwrap().scan_filter.as_deref(),
        Some("A")
    );
    recorded_then_recovered(&state, &output, &under_filter_b(&state, "c2"));
    // What run 1 finished under A is read again under B; run 2's work is kept.
    let snapshot = load_inputs(&state).unwrap();
    assert_eq!(snapshot.scan_filter.as_deref(), Some("B"));
    assert_eq!(snapshot.files.keys().collect::<Vec<_>>(), ["/in/b.parquet"]);
    assert_eq!(
        snapshot.files["/in/b.parquet"].row_groups,
        BTreeSet::from([1])
    );
}

#[test]
fn inputs_finished_with_no_scan_filter_stay_finished_under_one() {
    let (_tmp, state, output) = dirs();
    recorded_then_recovered(&state, &output, &record(&state, "c1"));
    recorded_then_recovered(&state, &output, &under_filter_b(&state, "c2"));
    let snapshot = load_inputs(&state).unwrap();
    assert_eq!(snapshot.scan_filter.as_deref(), Some("B"));
    assert_eq!(
        snapshot.files.len(),
        2,
        "every row of a.parquet was read before"
    );
}

#[test]
fn the_snapshot_counts_the_input_rows_of_its_commits_per_scan_filter() {
    let (_tmp, state, output) = dirs();
    let rows = |state: &Dir| load_inputs(state).unwrap().input_rows;
    assert_eq!(rows(&state), Some(0), "nothing done");
    recorded_then_recovered(&state, &output, &record(&state, "c1"));
    recorded_then_recovered(&state, &output, &record(&state, "c2"));
    assert_eq!(rows(&state), Some(8));
    // Another filter is another job: counted from 0.
    recorded_then_recovered(&state, &output, &under_filter_b(&state, "c3"));
    assert_eq!(rows(&state), Some(4));
    // A commit that did not count its rows: the count is unknown from then on.
    let mut uncounted = under_filter_b(&state, "c4");
    uncounted.input_rows = None;
    recorded_then_recovered(&state, &output, &uncounted);
    assert_eq!(rows(&state), None);
    recorded_then_recovered(&state, &output, &under_filter_b(&state, "c5"));
    assert_eq!(rows(&state), None);
}

#[test]
fn staged_files_without_a_record_are_rolled_back() {
    let (_tmp, state, output) = dirs();
    stage(&state, &output, "c2");
    assert_eq!(recover(&state, &output).unwrap(), 0);
    assert!(!output.exists("part-c2.parquet").unwrap());
    assert!(!state.exists("shard=1/part-c2.parquet").unwrap());
    assert!(output.list("").unwrap().is_empty());
}

#[test]
fn the_last_recovery_of_a_run_does_not_publish_again_what_the_run_published() {
    let (_tmp, state, output) = dirs_on("memory");
    // A record whose files are neither staged nor published: publishing it fails...
    let bytes = serde_json::to_vec(&record(&state, "c5")).unwrap();
    state
        .put_atomic(&format!("{COMMITS}/c5.json"), bytes)
        .unwrap();
    // ...so a recovery that trusts the commit as published must not have tried.
    let published = BTreeSet::from(["c5".to_string()]);
    assert_eq!(recover_skipping(&state, &output, &published).unwrap(), 1);
    assert!(state.list(COMMITS).unwrap().is_empty(), "record folded");
    let snapshot = load_inputs(&state).unwrap();
    assert_eq!(
        snapshot.files["/in/a.parquet"].row_groups,
        BTreeSet::from([0, 2])
    );
}

#[test]
fn a_record_whose_files_vanished_is_an_error() {
    for kind in ["local", "memory"] {
        vanished_files_on(kind);
    }
}

fn vanished_files_on(kind: &str) {
    let (_tmp, state, output) = dirs_on(kind);
    let bytes = serde_json::to_vec(&record(&state, "c3")).unwrap();
    state
        .put_atomic(&format!("{COMMITS}/c3.json"), bytes)
        .unwrap();
    let err = recover(&state, &output).unwrap_err().to_string();
    assert!(
        err.contains("part-c3.parquet") && err.contains("deleted by hand"),
        "{err}"
    );
    state
        .put_atomic(&format!("{COMMITS}/c4.json"), b"{\"format\": 1".to_vec())
        .unwrap();
    state.delete(&format!("{COMMITS}/c3.json")).unwrap();
    let err = recover(&state, &output).unwrap_err().to_string();
    assert!(err.contains("c4.json") && err.contains("damaged"), "{err}");
}

#[test]
fn a_fold_killed_before_deleting_its_records_folds_nothing_twice() {
    for kind in ["local", "memory"] {
        let (_tmp, state, output) = dirs_on(kind);
        for commit in ["c1", "c2"] {
            stage(&state, &output, commit);
            let bytes = serde_json::to_vec(&record(&state, commit)).unwrap();
            state
                .put_atomic(&recovery::record_path(commit), bytes)
                .unwrap();
        }
        // A fold (published records, as a run folds its own) whose snapshot was written,
        // killed before it deleted the records.
        let records = [record(&state, "c1"), record(&state, "c2")];
        for r in &records {
            recovery::publish(&state, &output, r).unwrap();
        }
        let mut snapshot = load_inputs(&state).unwrap();
        for r in &records {
            snapshot.fold(r);
        }
        snapshot.folded = vec!["c1".into(), "c2".into()];
        state
            .put_atomic(INPUTS, serde_json::to_vec(&snapshot).unwrap())
            .unwrap();
        // The next recovery finds them beside a record of a later run.
        let mut newer = under_filter_b(&state, "c3");
        newer.ids = None;
        recorded_then_recovered(&state, &output, &newer);
        let snapshot = load_inputs(&state).unwrap();
        assert_eq!(
            snapshot.ids, 6,
            "{kind}: the ids of c1 and c2, counted once"
        );
        assert_eq!(snapshot.scan_filter.as_deref(), Some("B"), "{kind}");
        assert!(snapshot.files.contains_key("/in/b.parquet"), "{kind}");
        assert!(state.list(COMMITS).unwrap().is_empty(), "{kind}");
        assert!(output.exists("part-c1.parquet").unwrap());
    }
}

#[test]
fn a_complete_file_keeps_no_row_groups_or_positions_in_the_snapshot() {
    let (_tmp, state, output) = dirs();
    let mut partly = record(&state, "c1");
    partly.inputs[0]
        .consumed
        .insert(1, serde_json::from_str("[[0, 10]]").unwrap());
    recorded_then_recovered(&state, &output, &partly);
    let snapshot = load_inputs(&state).unwrap();
    let a = &snapshot.files["/in/a.parquet"];
    assert!(!a.complete && a.row_groups.len() == 2 && a.consumed.len() == 1);
    let mut finishing = record(&state, "c2");
    finishing.inputs[0].complete = true;
    recorded_then_recovered(&state, &output, &finishing);
    let a = load_inputs(&state).unwrap().files["/in/a.parquet"].clone();
    assert!(a.complete && a.row_groups.is_empty() && a.consumed.is_empty());
}

/// Recovery tells records by what is still staged: a commit killed before its publish is
/// published, one killed between its two publishes is finished, one fully published is
/// only checked, and one whose published file was deleted by hand is a damaged checkpoint.
#[test]
fn recovery_publishes_what_is_still_staged_and_checks_the_rest() {
    for kind in ["local", "memory"] {
        let (_tmp, state, output) = dirs_on(kind);
        let write_record = |commit: &str| {
            let bytes = serde_json::to_vec(&record(&state, commit)).unwrap();
            state
                .put_atomic(&format!("{COMMITS}/{commit}.json"), bytes)
                .unwrap();
        };
        for commit in ["c1", "c2", "c3"] {
            stage(&state, &output, commit);
            write_record(commit);
        }
        // c2: its id part published, its data file still staged; c3: both published, its
        // dead letters still staged.
        let ids_of = |c: &str| {
            (
                format!("{STAGING}/{c}/shard=1/part-{c}.parquet"),
                format!("shard=1/part-{c}.parquet"),
            )
        };
        state.publish_all(&[ids_of("c2"), ids_of("c3")]).unwrap();
        output
            .publish(
                &format!("{}/part-c3.parquet", output_staging(&state)),
                "part-c3.parquet",
            )
            .unwrap();
        assert_eq!(recover(&state, &output).unwrap(), 3, "{kind}");
        for commit in ["c1", "c2", "c3"] {
            let dead = format!("_dead_letter/f/part-{commit}.parquet");
            assert!(output.exists(&dead).unwrap(), "{kind} {commit}");
            assert_eq!(
                output
                    .get(&format!("part-{commit}.parquet"))
                    .unwrap()
                    .unwrap()
                    .as_ref(),
                b"data",
                "{kind} {commit}"
            );
            assert!(state
                .exists(&format!("shard=1/part-{commit}.parquet"))
                .unwrap());
        }

        // c4 published whole, then its data file deleted by hand: recovery says so.
        stage(&state, &output, "c4");
        write_record("c4");
        state.publish_all(&[ids_of("c4")]).unwrap();
        output
            .publish(
                &format!("{}/part-c4.parquet", output_staging(&state)),
                "part-c4.parquet",
            )
            .unwrap();
        output
            .publish(
                &format!("{}/_dead_letter/f/part-c4.parquet", output_staging(&state)),
                "_dead_letter/f/part-c4.parquet",
            )
            .unwrap();
        output.delete("part-c4.parquet").unwrap();
        let err = recover(&state, &output).unwrap_err().to_string();
        assert!(
            err.contains("part-c4.parquet") && err.contains("neither published nor staged"),
            "{kind}: {err}"
        );
    }
}
