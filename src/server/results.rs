//! Results of statements that ran when the client submitted them (DDL,
//! `SET`, `INSERT`, job control), kept until the `DoGet` of their ticket.
//!
//! A driver may never read such a result (Python's DBAPI `execute` of a
//! `CREATE TABLE`, a JDBC client closing the statement at once): the
//! statement has taken effect anyway, and the result is forgotten after
//! [`KEPT_FOR`] or when [`MAX_KEPT`] newer ones push it out. A live query
//! whose result is forgotten unread has its job stopped.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use tonic::Status;

use crate::session::{StatementResult, job_row_schema};

/// A ticket for a kept result starts with this; any other ticket is SQL
/// (which never starts with a NUL byte).
const PREFIX: &[u8] = b"\0weir-result:";

/// How long an unread result is kept.
pub const KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Most unread results kept (all clients).
pub const MAX_KEPT: usize = 10_000;

#[derive(Default)]
pub struct Results {
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_handle: HashMap<Vec<u8>, (Instant, StatementResult)>,
    /// Handles oldest first.
    order: VecDeque<Vec<u8>>,
}

impl Results {
    /// Keeps `result`; returns the ticket handle that reads it.
    pub fn keep(&self, result: StatementResult) -> Result<Vec<u8>, Status> {
        let mut handle = PREFIX.to_vec();
        handle.extend_from_slice(super::auth::secret_token()?.as_bytes());
        let mut kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(oldest) = kept.order.front() {
            let expired = kept.by_handle.get(oldest).is_none_or(|(at, _)| at.elapsed() > KEPT_FOR);
            if !expired && kept.order.len() < MAX_KEPT {
                break;
            }
            if let Some(old) = kept.order.pop_front()
                && let Some((_, result)) = kept.by_handle.remove(&old)
            {
                super::discard(result);
            }
        }
        kept.by_handle.insert(handle.clone(), (Instant::now(), result));
        kept.order.push_back(handle.clone());
        Ok(handle)
    }

    /// The result a ticket names: `None` when the ticket is not a kept
    /// result's (it holds SQL); an error when it was one that is gone.
    pub fn take(&self, handle: &[u8]) -> Option<Result<StatementResult, Status>> {
        if !handle.starts_with(PREFIX) {
            return None;
        }
        let mut kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Some(match kept.by_handle.remove(handle) {
            Some((_, result)) => {
                kept.order.retain(|h| h != handle);
                Ok(result)
            }
            None => Err(Status::not_found(
                "this statement's result was already read or has expired; \
                 the statement itself ran when it was submitted",
            )),
        })
    }
}

/// The columns of a result.
pub fn schema_of(result: &StatementResult) -> SchemaRef {
    match result {
        StatementResult::Rows(schema, _) => schema.clone(),
        StatementResult::Explain(_) => Arc::new(Schema::new(vec![Field::new("plan", DataType::Utf8, false)])),
        StatementResult::Done(_) => Arc::new(Schema::empty()),
        StatementResult::JobStarted { .. } => job_row_schema(),
        StatementResult::JobEnded { .. } => crate::session::job_end_schema(),
        StatementResult::Stream(rs) => rs.schema.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_read_once_and_sql_tickets_pass_through() {
        let results = Results::default();
        let handle = results.keep(StatementResult::Done("ok".into())).expect("kept");
        assert!(matches!(results.take(&handle), Some(Ok(StatementResult::Done(_)))));
        let again = results.take(&handle).expect("a result ticket");
        assert_eq!(again.err().map(|s| s.code()), Some(tonic::Code::NotFound));
        assert!(results.take(b"SELECT 1").is_none());
    }
}
