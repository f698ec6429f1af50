//! The schema's migrations, embedded in the binary: each file of `migrations/` (listed by
//! build.rs, its text by `include_str!`) made into the migration sqlx's `migrate!` would embed —
//! version, description, checksum (SHA-384 of the text, by `Migration::new`) and the
//! `-- no-transaction` marker — so that databases migrated by either agree. Without sqlx's proc
//! macros, whose build compiled sqlx's Postgres driver and TLS stack a second time for the
//! compiler (issue 41). `a_migration_is_embedded_as_sqlx_reads_it_from_the_directory` holds the
//! two equal.
//!
//! Neighbours: `db` runs [`MIGRATOR`] when it connects.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// (version, description, SQL) of each file of `migrations/`, in version order (build.rs).
const FILES: &[(i64, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// The embedded migrations, as `sqlx::migrate!("./migrations")` would make them.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| Migrator { migrations: Cow::Owned(embedded()), ..Migrator::DEFAULT });

fn embedded() -> Vec<Migration> {
    FILES
        .iter()
        .map(|&(version, description, sql)| {
            Migration::new(version, Cow::Borrowed(description), MigrationType::Simple, Cow::Borrowed(sql), sql.starts_with("-- no-transaction"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_migration_is_embedded_as_sqlx_reads_it_from_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let from_dir = Migrator::new(dir.as_path()).await.expect("sqlx reads migrations/");
        let ours: Vec<_> = MIGRATOR.iter().map(|m| (m.version, m.description.to_string(), m.migration_type, m.checksum.to_vec(), m.no_tx)).collect();
        let theirs: Vec<_> = from_dir.iter().map(|m| (m.version, m.description.to_string(), m.migration_type, m.checksum.to_vec(), m.no_tx)).collect();
        assert!(ours.len() >= 16, "every file of migrations/ is embedded: {}", ours.len());
        assert_eq!(ours, theirs);
        // The checksum is the text's: a changed file would be refused by a database it migrated.
        let first = &MIGRATOR.iter().next().expect("a migration").sql;
        assert!(first.contains("CREATE TABLE"), "the text itself is embedded");
    }
}
