//! Who may do what: users and their roles, and the option values that are
//! never shown.
//!
//! Roles (a `weir serve` users file gives each user one):
//! - `admin`: everything, including other users' jobs;
//! - `user`: DDL, `INSERT` (jobs it then owns), `SET`, and job control of
//!   its own jobs;
//! - `read`: queries only (`SELECT`, `SUBSCRIBE`, `SHOW`, `DESCRIBE`,
//!   `EXPLAIN`) on the tables and views that exist.
//!
//! The embedded shell and `weir run` act as the local `admin`.

use weir_sql::{SqlError, Statement};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    User,
    Read,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s.trim().to_ascii_lowercase().as_str() {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            "read" => Some(Role::Read),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Read => "read",
        }
    }
}

/// The user a statement runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: String,
    pub role: Role,
}

impl Principal {
    /// The embedded shell, `weir run`, and a server without passwords.
    pub fn local() -> Self {
        Self {
            user: "local".into(),
            role: Role::Admin,
        }
    }

    /// Whether this principal may run `stmt` at all (job ownership is
    /// checked where the job is known).
    pub fn authorize(&self, stmt: &Statement) -> Result<(), SqlError> {
        if self.role == Role::Read && !is_read_only(stmt) && !sets_result_mode(stmt) {
            return Err(SqlError::permission_denied(format!(
                "permission denied: user '{}' has role 'read', which may only query \
                 (SELECT, SUBSCRIBE, SHOW, DESCRIBE, EXPLAIN), not {}",
                self.user,
                statement_kind(stmt)
            )));
        }
        Ok(())
    }

    /// Whether this principal may stop or cancel a job owned by `owner`.
    pub fn may_control(&self, owner: Option<&str>) -> bool {
        self.role == Role::Admin || (self.role == Role::User && owner == Some(self.user.as_str()))
    }
}

/// Statements without effects: queries, SHOW, DESCRIBE, EXPLAIN, and
/// `SET` without a value (which lists the options).
pub fn is_read_only(stmt: &Statement) -> bool {
    matches!(
        stmt,
        Statement::Query(_)
            | Statement::Subscribe(_)
            | Statement::ShowTables
            | Statement::ShowViews
            | Statement::ShowCreate { .. }
            | Statement::Describe(_)
            | Statement::ShowWatermarks(_)
            | Statement::ShowCheckpoints(_)
            | Statement::ShowSavepoints(_)
            | Statement::ShowJobs
            | Statement::DescribeJob(_)
            | Statement::Explain(_)
            | Statement::Set(None)
    )
}

/// `SET`/`RESET` of how the session's results are shown, nothing else: a
/// read user may (the remote shell sets it on every connection). Not
/// read-only: it takes effect when submitted, as every `SET`.
fn sets_result_mode(stmt: &Statement) -> bool {
    matches!(
        stmt,
        Statement::Set(Some((k, _))) | Statement::Reset(Some(k))
            if k.eq_ignore_ascii_case(weir_engine::config::RESULT_MODE)
    )
}

fn statement_kind(stmt: &Statement) -> &'static str {
    match stmt {
        Statement::CreateTable(_) => "CREATE TABLE",
        Statement::CreateView { .. } => "CREATE VIEW",
        Statement::Drop { view: true, .. } => "DROP VIEW",
        Statement::Drop { .. } => "DROP TABLE",
        Statement::AlterTable { .. } => "ALTER TABLE",
        Statement::Insert { .. } => "INSERT",
        Statement::StopJob(_) | Statement::StopJobWithSavepoint { .. } => "STOP JOB",
        Statement::SavepointJob { .. } => "SAVEPOINT JOB",
        Statement::CancelJob(_) => "CANCEL JOB",
        Statement::Set(_) => "SET",
        Statement::Reset(_) => "RESET",
        _ => "this statement",
    }
}

pub use weir_catalog::options::{MASK, is_secret_key, shown};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_are_masked() {
        for k in [
            "password",
            "properties.sasl.jaas.config",
            "aws.secret-key",
            "auth.TOKEN",
            "PASSWORD",
        ] {
            assert_eq!(shown(k, "hunter2"), MASK, "{k}");
        }
        assert_eq!(shown("path", "/data"), "/data");
    }
}
