//! `blobgate db`: the schema's migrations (`status`, `migrate`) and `copy`; and the one warning line every
//! command gives on a database a newer release migrated.

use anyhow::bail;

use crate::config::{DatabaseUrl, Settings};
use crate::store::{Metadata, MigrationEntry, MigrationStatus, Store};

/// `db status`: one line per migration, this binary's and the database's. Reads only, and creates nothing: a
/// database without a schema (or, SQLite, without a file) has every migration pending, said on stderr.
pub(super) async fn status(settings: &Settings, json: bool) -> anyhow::Result<()> {
    let database = settings.database_url()?;
    let status = Metadata::migration_status(&database, settings.timeouts.database()).await?;
    for migration in &status.migrations {
        println!("{}", line(migration, json));
    }
    // The line each other command would answer with, as a note here: this command answers anyway.
    let note = status.check(&database).err().map(|e| format!("{e:#}")).or_else(|| status.newer_note());
    if let Some(note) = note {
        eprintln!("blobgate: {note}");
    }
    Ok(())
}

/// `db migrate`: applies this binary's pending migrations and prints each as `db status` does.
pub(super) async fn migrate(settings: &Settings, json: bool) -> anyhow::Result<()> {
    let database = settings.database_url()?;
    let meta = Metadata::open(&database, &settings.data_dir, settings.timeouts.database()).await?;
    let status = meta.migrations().clone();
    meta.close().await;
    for migration in status.migrations.iter().filter(|m| status.applied_now.contains(&m.version)) {
        println!("{}", line(migration, json));
    }
    if status.applied_now.is_empty() {
        let latest = status.latest_known();
        eprintln!("blobgate: nothing pending: every migration of this release (up to {latest}) is applied");
    }
    warn_of_newer(&status);
    Ok(())
}

/// One line on stderr when a newer release migrated the database (every command that opens it says it once).
pub(super) fn warn_of_newer(status: &MigrationStatus) {
    if let Some(note) = status.newer_note() {
        eprintln!("blobgate: warning: {note}; carrying on (docs/operations.md, \"Upgrades and rollbacks\")");
    }
}

/// A migration as `db status` prints it: `VERSION\tSTATE\tAPPLIED_AT\tDESCRIPTION` (`-` when not applied), or
/// a JSON object with `version`, `description`, `state` and `applied_at` (RFC 3339, or null).
fn line(migration: &MigrationEntry, json: bool) -> String {
    let applied_at = migration.applied_at.map(super::rfc3339);
    if json {
        let line = serde_json::json!({
            "version": migration.version,
            "description": migration.description,
            "state": migration.state.as_str(),
            "applied_at": applied_at,
        });
        return line.to_string();
    }
    let at = applied_at.as_deref().unwrap_or("-");
    format!("{}\t{}\t{at}\t{}", migration.version, migration.state.as_str(), migration.description)
}

/// `db copy --to URL`: prints one JSON line with the rows copied per table.
pub(super) async fn copy(store: &Store, to: &str, settings: &Settings) -> anyhow::Result<()> {
    if let Some(note) = store.meta.migrations().newer_note() {
        // The copy knows this release's tables and columns only: the newer release's would be left behind.
        bail!("{note}, whose tables and columns this release cannot copy: run `db copy` with that release");
    }
    let target_url = DatabaseUrl::parse(to).map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    if target_url == settings.database_url()? {
        bail!("--to names the database being copied");
    }
    let target = Metadata::open(&target_url, &settings.data_dir, settings.timeouts.sqlite_busy)
        .await
        .map_err(|e| anyhow::anyhow!("--to: {e:#}"))?;
    let copied = store.meta.copy_to(&target).await;
    target.close().await;
    let copied: serde_json::Map<String, serde_json::Value> =
        copied?.into_iter().map(|(table, rows)| (table.to_owned(), rows.into())).collect();
    println!("{}", serde_json::json!({ "to": target_url.to_string(), "copied": copied }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MigrationState;

    #[test]
    fn a_migration_prints_as_tab_separated_text_or_json() {
        let applied = MigrationEntry {
            version: 15,
            description: "object tags".into(),
            state: MigrationState::Applied,
            applied_at: Some(1_700_000_000),
        };
        assert_eq!(line(&applied, false), "15\tapplied\t2023-11-14T22:13:20Z\tobject tags");
        let json: serde_json::Value = serde_json::from_str(&line(&applied, true)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": 15, "description": "object tags", "state": "applied",
                "applied_at": "2023-11-14T22:13:20Z"})
        );
        let pending = MigrationEntry { state: MigrationState::Pending, applied_at: None, ..applied };
        assert_eq!(line(&pending, false), "15\tpending\t-\tobject tags");
        let json: serde_json::Value = serde_json::from_str(&line(&pending, true)).unwrap();
        assert_eq!((&json["state"], &json["applied_at"]), (&"pending".into(), &serde_json::Value::Null));
    }
}
