//! Where a run of a job starts, read from its checkpoint log (the fence's
//! records, see [`crate::checkpoint::fence`]).
//!
//! A worker is started again with the same arguments after every exit
//! (a pod restarted by Kubernetes, a process by systemd), including
//! `--from-savepoint`: that flag starts a *deployment*, and later runs of
//! the same deployment resume from the checkpoints taken since (Flink's
//! operator does the same with `initialSavepointPath`). And a job over
//! workers that ended on purpose (finished, stopped with a savepoint) is
//! not run again by a restarted pod: its output is committed, and
//! running it again would write it twice.

use std::path::{Path, PathBuf};

use crate::checkpoint::records::Record;

/// What a run does first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// No earlier run to go on from (none, or the last ended on purpose):
    /// the job's old checkpoints are cleared and it starts afresh.
    Afresh,
    /// The last run died, failed or was suspended: resume from the newest
    /// checkpoint numbered `floor` or above (those of the runs since the
    /// deployment started), else from `path` (the savepoint it started
    /// from, when none was taken since), else afresh.
    Latest { floor: u64, path: Option<PathBuf> },
    /// Restore this savepoint or checkpoint (a new deployment from it).
    Path(PathBuf),
    /// A job over workers that ended on purpose: not run again. Says how
    /// it ended and what would run it anew.
    Ended { status: String, message: String },
}

/// The end of a run of a job over workers whose restart strategy gave up
/// at its start: it did not run, and the failure it gave up on stands for
/// the next start (which gives up again, unless the strategy was
/// loosened).
pub const EXHAUSTED: &str = "EXHAUSTED";

/// Whether a run that ended so ended on purpose (the next run starts
/// afresh); a missing status is a run that died.
fn on_purpose(status: &str) -> bool {
    matches!(status.trim(), "FINISHED" | "STOPPED" | "CANCELED")
}

/// Decides from `records`, the log as the previous runs left it (every
/// record before this run's claim), `path` (the run's
/// `execution.state-recovery.path`), whether the job runs over workers,
/// and `status_file` (the status file, for a log without any end: a
/// directory written before the log kept statuses).
pub fn decide(records: &[Record], path: Option<&Path>, workers: bool, status_file: Option<&str>) -> Start {
    // How the last run ended: its end record, or none (it died, or it is
    // the run of a worker restarted beside a live worker 0).
    let last_status: Option<String> = match records.last() {
        Some(Record::End { status, .. }) if !status.is_empty() => Some(status.clone()),
        Some(Record::End { .. }) | None => status_file.map(str::to_string),
        Some(_) => None,
    };
    // The runs since the last one that ended on purpose (the run after
    // such an end started afresh or from a path), and among them the
    // deployment the last run belongs to: the newest path a claim started
    // from, and the first claim that started from it (later runs of the
    // deployment record the same path, or none if the flag was dropped).
    let deployment = deployment(records);
    let ended = |status: &str| {
        let how = match status.trim() {
            "FINISHED" => "finished".to_string(),
            "STOPPED" => match stopped_with(records) {
                Some(sp) => format!("been stopped with savepoint {sp} (start it from there with --from-savepoint)"),
                None => "been stopped".to_string(),
            },
            other => format!("ended ({})", other.to_lowercase()),
        };
        Start::Ended {
            status: status.trim().to_string(),
            message: format!(
                "has {how}; its checkpoints say so, so it is not run again (clear its checkpoints, or use \
                 another 'pipeline.name' or another --from-savepoint, to run it anew)"
            ),
        }
    };
    if let Some(p) = path {
        let text = p.display().to_string();
        // Started from this very path before: a restart of the same
        // deployment (the same arguments again), unless that is what the
        // user asks for on a single machine, where every `weir run
        // --from-savepoint` is a new job.
        let again = workers && deployment.is_some_and(|(_, f)| f == text);
        if !again {
            return Start::Path(p.to_path_buf());
        }
        if let Some(s) = last_status.as_deref().filter(|s| on_purpose(s)) {
            return ended(s);
        }
        return latest(records, deployment);
    }
    match last_status.as_deref() {
        Some(s) if on_purpose(s) => {
            if workers {
                ended(s)
            } else {
                Start::Afresh
            }
        }
        // The log ends in a run that died, or failed, or was suspended.
        Some(_) => latest(records, deployment),
        None if records.is_empty() => Start::Afresh,
        None => latest(records, deployment),
    }
}

/// The savepoint the job was stopped with: that of the last run that did
/// more than end at once (pods restarted after the stop end so), if it
/// took one before it ended (a stop without one names none, never an
/// older savepoint).
fn stopped_with(records: &[Record]) -> Option<String> {
    let claims: Vec<usize> = (0..records.len())
        .filter(|i| matches!(records[*i], Record::Generation { .. }))
        .collect();
    let ends = claims.iter().skip(1).copied().chain(std::iter::once(records.len()));
    let runs: Vec<&[Record]> = claims.iter().zip(ends).map(|(a, b)| &records[*a..b]).collect();
    let run = runs
        .iter()
        .rev()
        .find(|run| !(run.len() <= 2 && run.iter().skip(1).all(|r| matches!(r, Record::End { .. }))))?;
    run.iter().rev().find_map(|r| match r {
        Record::Savepoint { path, .. } => Some(path.clone()),
        _ => None,
    })
}

/// The deployment the last run belongs to, among the runs since the last
/// end on purpose: the newest path a claim started from, and where its
/// deployment began (index in `records`): walking back from that claim
/// over claims of the same path or of none (a flag dropped after the
/// first start), up to a claim from another path (an earlier deployment,
/// whose checkpoints are not this one's).
fn deployment(records: &[Record]) -> Option<(usize, &str)> {
    let cut = line_start(records);
    let newest = (cut..records.len())
        .rev()
        .find(|i| matches!(&records[*i], Record::Generation { from: Some(_), .. }))?;
    let Record::Generation { from: Some(path), .. } = &records[newest] else {
        return None;
    };
    let mut first = newest;
    for i in (cut..newest).rev() {
        match &records[i] {
            Record::Generation { from: Some(f), .. } if f == path => first = i,
            Record::Generation { from: Some(_), .. } => break,
            _ => {}
        }
    }
    Some((first, path.as_str()))
}

/// Where the runs that go on from one another begin: after the last end
/// on purpose (not the log's last record: the run after it is the one
/// deciding).
fn line_start(records: &[Record]) -> usize {
    records
        .iter()
        .enumerate()
        .rev()
        .skip(1)
        .find(|(_, r)| matches!(r, Record::End { status, .. } if on_purpose(status)))
        .map_or(0, |(i, _)| i + 1)
}

/// Whether a run that left `records` (its claim first) ended as it meant
/// to: finished, stopped, cancelled, or suspended (a pod deleted is no
/// failure). A run that died leaves no end; one that failed ends FAILED.
fn ended_well(run: &[Record]) -> bool {
    run.iter().any(|r| {
        matches!(r, Record::End { status, .. }
            if matches!(status.trim(), "FINISHED" | "STOPPED" | "CANCELED" | "SUSPENDED"))
    })
}

/// Whether the run about to start (after `records`, every record before
/// its claim) follows a failure of the last run: the last run did not end
/// well, and this start is not a new deployment (`path` other than the
/// one the last runs started from).
pub fn after_failure(records: &[Record], path: Option<&Path>) -> bool {
    if let Some(p) = path
        && deployment(records).is_none_or(|(_, f)| f != p.display().to_string())
    {
        return false;
    }
    match records.iter().rposition(|r| matches!(r, Record::Generation { .. })) {
        Some(last) => !ended_well(&records[last..]),
        None => false,
    }
}

/// When the earlier restarts after a failure happened (ms, oldest first),
/// since the line of runs began (the last end on purpose) or, later, the
/// current deployment did: every claim but the first, unless the run
/// before it ended well (see [`ended_well`]). A claim whose run gave up
/// ([`EXHAUSTED`]) is no restart: it did not run. What a restart strategy
/// counts across workers (see [`super::restart`]).
pub fn restarts(records: &[Record]) -> Vec<i64> {
    let start = deployment(records).map_or_else(|| line_start(records), |(first, _)| first);
    let claims: Vec<usize> = (start..records.len())
        .filter(|i| matches!(records[*i], Record::Generation { .. }))
        .collect();
    let ends = claims.iter().skip(1).copied().chain(std::iter::once(records.len()));
    let runs: Vec<(usize, usize)> = claims.iter().copied().zip(ends).collect();
    let gave_up = |(a, b): (usize, usize)| {
        records[a..b]
            .iter()
            .any(|r| matches!(r, Record::End { status, .. } if status.trim() == EXHAUSTED))
    };
    // The line's (or deployment's) first claim started it.
    runs.windows(2)
        .filter(|w| !ended_well(&records[w[0].0..w[0].1]) && !gave_up(w[1]))
        .filter_map(|w| match &records[w[1].0] {
            Record::Generation { time_ms, .. } => Some(*time_ms),
            _ => None,
        })
        .collect()
}

/// Resume: from checkpoints published since `deployment`'s claim (at
/// index `i` of `records`, started from `from`), or from any checkpoint
/// when the deployment started afresh.
fn latest(records: &[Record], deployment: Option<(usize, &str)>) -> Start {
    let Some((i, from)) = deployment else {
        return Start::Latest { floor: 0, path: None };
    };
    let since = records[i].generation();
    // Ids grow across runs (a claim's ids are above every earlier one):
    // the deployment's checkpoints are those at or above the first it
    // published, and with none published yet it starts from its path.
    let floor = records[i..]
        .iter()
        .filter_map(|r| match r {
            Record::Checkpoint { generation, checkpoint } if *generation >= since => Some(*checkpoint),
            _ => None,
        })
        .min();
    match floor {
        Some(floor) => Start::Latest {
            floor,
            path: Some(PathBuf::from(from)),
        },
        None => Start::Path(PathBuf::from(from)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(generation: u64, from: Option<&str>) -> Record {
        Record::Generation {
            generation,
            owner: "test".into(),
            time_ms: 0,
            from: from.map(str::to_string),
        }
    }
    fn chk(generation: u64, checkpoint: u64) -> Record {
        Record::Checkpoint { generation, checkpoint }
    }
    fn end(generation: u64, status: &str) -> Record {
        Record::End {
            generation,
            status: status.into(),
            next_id: 0,
        }
    }
    fn sp(generation: u64, checkpoint: u64, path: &str) -> Record {
        Record::Savepoint {
            generation,
            checkpoint,
            path: path.into(),
        }
    }

    #[test]
    fn a_first_run_starts_afresh_and_a_died_run_resumes() {
        assert_eq!(decide(&[], None, true, None), Start::Afresh);
        let log = [claim(1, None), chk(1, 1), chk(1, 2)];
        assert_eq!(decide(&log, None, true, None), Start::Latest { floor: 0, path: None });
        let log = [claim(1, None), chk(1, 1), end(1, "SUSPENDED")];
        assert_eq!(decide(&log, None, true, None), Start::Latest { floor: 0, path: None });
    }

    #[test]
    fn a_finished_or_stopped_job_over_workers_is_not_run_again() {
        let log = [claim(1, None), chk(1, 1), end(1, "FINISHED")];
        assert!(matches!(decide(&log, None, true, None), Start::Ended { status, .. } if status == "FINISHED"));
        // On one machine a new `weir run` is a new job.
        assert_eq!(decide(&log, None, false, None), Start::Afresh);
        let log = [claim(1, None), chk(1, 1), sp(1, 2, "s3://b/sp-1"), end(1, "STOPPED")];
        match decide(&log, None, true, None) {
            Start::Ended { message, .. } => assert!(message.contains("s3://b/sp-1"), "{message}"),
            other => panic!("{other:?}"),
        }
        // The run restarted after the end, which ended at once, again.
        let log = [claim(1, None), end(1, "FINISHED"), claim(2, None), end(2, "FINISHED")];
        assert!(matches!(decide(&log, None, true, None), Start::Ended { .. }));
    }

    #[test]
    fn the_same_savepoint_again_resumes_the_deployment_it_started() {
        let p = Path::new("s3://b/sp-1");
        // An older deployment's checkpoints (1, 2), then one from the
        // savepoint that took 5 and 6 and died.
        let log = [
            claim(1, None),
            chk(1, 1),
            chk(1, 2),
            sp(1, 3, "s3://b/sp-1"),
            end(1, "STOPPED"),
            claim(5, Some("s3://b/sp-1")),
            chk(5, 5),
            chk(5, 6),
        ];
        // On one machine the path is restored as asked.
        assert_eq!(decide(&log, Some(p), false, None), Start::Path(p.into()));
        let resume = Start::Latest {
            floor: 5,
            path: Some(p.into()),
        };
        assert_eq!(decide(&log, Some(p), true, None), resume);
        // Without the flag (removed after the first start) the same.
        assert_eq!(decide(&log, None, true, None), resume);
        // Restarted before the deployment's first checkpoint: the path.
        let log = [claim(1, Some("s3://b/sp-1"))];
        assert_eq!(decide(&log, Some(p), true, None), Start::Path(p.into()));
        // Restarted again after a restart that took none: the deployment's
        // checkpoints from its first run still count.
        let log = [
            claim(1, Some("s3://b/sp-1")),
            chk(1, 5),
            chk(1, 6),
            claim(2, Some("s3://b/sp-1")),
        ];
        let resume = Start::Latest {
            floor: 5,
            path: Some(p.into()),
        };
        assert_eq!(decide(&log, Some(p), true, None), resume);
        let log = [claim(1, Some("s3://b/sp-1")), chk(1, 5), claim(2, None)];
        assert_eq!(
            decide(&log, None, true, None),
            Start::Latest {
                floor: 5,
                path: Some(p.into())
            }
        );
        // A new savepoint is a new deployment.
        let q = Path::new("s3://b/sp-2");
        assert_eq!(decide(&log, Some(q), true, None), Start::Path(q.into()));
        // A deployment from the path that then stopped is not rerun by
        // pods restarted with the old arguments.
        let log = [
            claim(1, Some("s3://b/sp-1")),
            chk(1, 4),
            sp(1, 5, "s3://b/sp-2"),
            end(1, "STOPPED"),
        ];
        assert!(matches!(decide(&log, Some(p), true, None), Start::Ended { .. }));
    }

    #[test]
    fn a_fresh_start_after_an_end_on_purpose_forgets_the_older_deployment() {
        let log = [
            claim(1, Some("s3://b/sp-1")),
            chk(1, 4),
            end(1, "CANCELED"),
            claim(3, None),
            chk(3, 9),
        ];
        assert_eq!(decide(&log, None, true, None), Start::Latest { floor: 0, path: None });
    }

    #[test]
    fn restarts_are_the_claims_after_failures_since_the_last_end_on_purpose() {
        let at = |generation: u64, time_ms: i64| Record::Generation {
            generation,
            owner: "test".into(),
            time_ms,
            from: None,
        };
        let log = [
            at(1, 10),
            end(1, "FINISHED"),
            at(3, 30),
            chk(3, 1),
            at(5, 50),
            end(5, "FAILED"),
            at(7, 70),
            end(7, "SUSPENDED"),
            at(9, 90),
        ];
        // 3 started the line; 5 and 7 followed failures; 9 a suspend.
        assert_eq!(restarts(&log), vec![50, 70]);
        assert!(restarts(&[]).is_empty());
        assert!(!after_failure(&log[..8], None), "the last run was suspended");
        assert!(after_failure(&log[..6], None), "the last run failed");
        assert!(after_failure(&log[..4], None), "the last run died");
        assert!(!after_failure(&log[..2], None), "the last run finished");
        assert!(!after_failure(&[], None));
        // A suspended run that published a checkpoint after its end (the
        // coordinator a moment late) is still no failure.
        let log = [at(1, 10), chk(1, 1), end(1, "SUSPENDED"), chk(1, 2), at(3, 30)];
        assert!(restarts(&log).is_empty());
        assert!(!after_failure(&log[..4], None));
    }

    #[test]
    fn a_give_up_is_no_restart_and_a_new_deployment_counts_afresh() {
        let from = |generation: u64, time_ms: i64, path: Option<&str>| Record::Generation {
            generation,
            owner: "test".into(),
            time_ms,
            from: path.map(str::to_string),
        };
        // Started, failed twice, gave up twice (pods restarted).
        let log = [
            from(1, 10, None),
            end(1, "FAILED"),
            from(3, 30, None),
            end(3, "FAILED"),
            from(5, 50, None),
            end(5, "FAILED"),
            from(7, 70, None),
            end(7, EXHAUSTED),
            from(9, 90, None),
            end(9, EXHAUSTED),
        ];
        // Two restarts ran; the failure that made them give up stands.
        assert_eq!(restarts(&log), vec![30, 50]);
        assert!(after_failure(&log, None));
        // A new deployment from a savepoint is no restart, and counts
        // from its own first claim.
        let p = Path::new("s3://b/sp-2");
        assert!(!after_failure(&log, Some(p)));
        let mut log = log.to_vec();
        log.extend([
            from(11, 110, Some("s3://b/sp-2")),
            end(11, "FAILED"),
            from(13, 130, None),
        ]);
        assert_eq!(restarts(&log), vec![130]);
        assert!(after_failure(&log[..12], Some(p)), "a restart of the same deployment");
    }

    #[test]
    fn a_deployment_begins_at_its_own_claims_not_an_earlier_one_from_the_same_path() {
        let from = |generation: u64, path: Option<&str>| Record::Generation {
            generation,
            owner: "test".into(),
            time_ms: 0,
            from: path.map(str::to_string),
        };
        let p = "s3://b/sp-p";
        let log = [
            from(1, Some(p)),
            chk(1, 5),
            chk(1, 6),
            from(4, Some("s3://b/sp-q")),
            chk(4, 9),
            from(7, Some(p)),
        ];
        // Back on p after q, crashed before a checkpoint: p again, never
        // q's checkpoint 9 nor the first p deployment's 5 and 6.
        assert_eq!(decide(&log, Some(Path::new(p)), true, None), Start::Path(p.into()));
    }

    #[test]
    fn a_stop_names_the_savepoint_of_the_run_that_stopped_only() {
        let log = [
            claim(1, None),
            sp(1, 3, "s3://b/sp-old"),
            chk(1, 4),
            end(1, "FAILED"),
            claim(3, None),
            chk(3, 5),
            end(3, "STOPPED"),
            claim(5, None),
            end(5, "STOPPED"),
        ];
        match decide(&log, None, true, None) {
            Start::Ended { message, .. } => assert!(
                !message.contains("sp-old") && message.contains("been stopped"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_status_file_answers_for_a_log_without_ends() {
        assert_eq!(
            decide(&[], None, false, Some("RUNNING")),
            Start::Latest { floor: 0, path: None }
        );
        assert_eq!(decide(&[], None, false, Some("STOPPED")), Start::Afresh);
    }
}
