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
    let cut = line_start(records);
    let current = &records[cut..];
    let deployment: Option<(usize, &str)> = current
        .iter()
        .rev()
        .find_map(|r| match r {
            Record::Generation { from: Some(f), .. } => Some(f.as_str()),
            _ => None,
        })
        .and_then(|f| {
            current
                .iter()
                .position(|r| matches!(r, Record::Generation { from: Some(g), .. } if g == f))
                .map(|i| (cut + i, f))
        });
    let ended = |status: &str| {
        let how = match status.trim() {
            "FINISHED" => "finished".to_string(),
            "STOPPED" => match records.iter().rev().find_map(|r| match r {
                Record::Savepoint { path, .. } => Some(path.clone()),
                _ => None,
            }) {
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
/// its claim) follows a failure of the last run.
pub fn after_failure(records: &[Record]) -> bool {
    match records.iter().rposition(|r| matches!(r, Record::Generation { .. })) {
        Some(last) => !ended_well(&records[last..]),
        None => false,
    }
}

/// When the earlier restarts after a failure happened (ms, oldest first):
/// every claim since the job's line of runs began but its first, unless
/// the run before it ended well (see [`ended_well`]). What a restart
/// strategy counts across workers (see [`super::restart`]).
pub fn restarts(records: &[Record]) -> Vec<i64> {
    let start = line_start(records);
    let claims: Vec<usize> = (start..records.len())
        .filter(|i| matches!(records[*i], Record::Generation { .. }))
        .collect();
    // The line's first claim started it.
    claims
        .windows(2)
        .filter(|w| !ended_well(&records[w[0]..w[1]]))
        .filter_map(|w| match &records[w[1]] {
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
        assert!(!after_failure(&log[..8]), "the last run was suspended");
        assert!(after_failure(&log[..6]), "the last run failed");
        assert!(after_failure(&log[..4]), "the last run died");
        assert!(!after_failure(&log[..2]), "the last run finished");
        assert!(!after_failure(&[]));
        // A suspended run that published a checkpoint after its end (the
        // coordinator a moment late) is still no failure.
        let log = [at(1, 10), chk(1, 1), end(1, "SUSPENDED"), chk(1, 2), at(3, 30)];
        assert!(restarts(&log).is_empty());
        assert!(!after_failure(&log[..4]));
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
