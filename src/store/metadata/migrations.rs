//! The schema's migrations: the ones this binary embeds, the ones a database records (`_sqlx_migrations`), and how
//! the two compare (`MigrationStatus::compare`, pure).
//!
//! A database that a newer release migrated is served: its later migrations only add tables, columns with
//! defaults and indexes that this release ignores (docs/operations.md, "Upgrades and rollbacks"), so a rollback, or an old
//! replica restarting mid-rollout, keeps working. Anything else this binary does not know (a migration below its
//! latest, one of its own with another checksum, one of its own skipped under a later one, one that failed
//! part-way) means another line of releases or a broken migration, and is refused in one line ([`SchemaError`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

use sqlx::migrate::{Migrate, Migration, MigrationType, Migrator};
use sqlx::{ConnectOptions, Connection};

use super::{Backend, Metadata, MetadataError};
use crate::config::DatabaseUrl;

/// The embedded migrations: applied by `open`, compared by `open_read_only`.
pub(super) static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| embedded(&SQLITE_FILES));
/// PostgreSQL's own migrations (its schema is written in its own dialect), tracked in that database.
pub(super) static PG_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| embedded(&POSTGRES_FILES));

/// `[(file name, text)]` of the named files of a directory of migrations, embedded in the binary.
macro_rules! migration_files {
    ($dir:literal: $($file:literal),* $(,)?) => {
        [$(($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $dir, "/", $file)))),*]
    };
}

/// Every file of `migrations/`, listed by hand where `sqlx::migrate!` would read the directory: that macro needs
/// sqlx's `macros` feature (see `from_row!`). `every_migration_file_is_embedded_as_sqlx_reads_it` checks the lists
/// against the directories.
const SQLITE_FILES: [(&str, &str); 24] = migration_files!("migrations":
    "0001_buckets_objects.sql",
    "0002_auth.sql",
    "0003_download_stats.sql",
    "0004_cache_changes.sql",
    "0005_stats_without_sort_indexes.sql",
    "0006_bucket_defaults.sql",
    "0007_sealed_signing_secrets.sql",
    "0008_bucket_cors.sql",
    "0009_variants.sql",
    "0010_s3_keys.sql",
    "0011_multipart.sql",
    "0012_stats_flush_marks.sql",
    "0013_multipart_complete_claim.sql",
    "0014_user_metadata.sql",
    "0015_object_tags.sql",
    "0016_upload_creators.sql",
    "0017_bucket_website.sql",
    "0018_grants.sql",
    "0019_part_sizes.sql",
    "0020_store_blob_retirements.sql",
    "0021_object_checksums.sql",
    "0022_multipart_completions.sql",
    "0023_stats_ledger.sql",
    "0024_principal_limits.sql",
);

/// Every file of `migrations/postgres/`, as [`SQLITE_FILES`].
const POSTGRES_FILES: [(&str, &str); 16] = migration_files!("migrations/postgres":
    "0001_schema.sql",
    "0010_s3_keys.sql",
    "0011_multipart.sql",
    "0012_stats_flush_marks.sql",
    "0013_multipart_complete_claim.sql",
    "0014_user_metadata.sql",
    "0015_object_tags.sql",
    "0016_upload_creators.sql",
    "0017_bucket_website.sql",
    "0018_grants.sql",
    "0019_part_sizes.sql",
    "0020_store_blob_retirements.sql",
    "0021_object_checksums.sql",
    "0022_multipart_completions.sql",
    "0023_stats_ledger.sql",
    "0024_principal_limits.sql",
);

/// A migrator of `files` made as `sqlx::migrate!` makes one (`sqlx::migrate::resolve_blocking`): version and
/// description from the file name (`0009_variants.sql`: 9, "variants"), the SHA-384 of the text as the checksum
/// `_sqlx_migrations` records, and no transaction for a file that starts `-- no-transaction`.
fn embedded(files: &[(&'static str, &'static str)]) -> Migrator {
    let migrations = files
        .iter()
        .map(|&(file, sql)| {
            let (version, name) = file.split_once('_').expect("a migration file is named VERSION_DESCRIPTION.sql");
            let version = version.parse().expect("a migration file's name starts with its version");
            let kind = MigrationType::from_filename(name);
            let description = name.trim_end_matches(kind.suffix()).replace('_', " ");
            Migration::new(version, description.into(), kind, sql.into(), sql.starts_with("-- no-transaction"))
        })
        .collect();
    Migrator { migrations: Cow::Owned(migrations), ..Migrator::DEFAULT }
}

/// What a read-only command says of a database without a schema: the commands that create one.
pub const CREATES_IT: &str = "`blobgate db migrate`, `blobgate serve` or `blobgate bucket create` creates it";

/// Where one migration stands in one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationState {
    /// This binary's, applied.
    Applied,
    /// This binary's, not applied yet.
    Pending,
    /// Applied by a newer release: unknown to this binary, and later than every migration it knows. Tolerated.
    Newer,
    /// Applied, unknown to this binary, and not later than all it knows: another line of releases. Refused.
    Unknown,
    /// This binary's version, applied with another checksum: another build's migration. Refused.
    Differs,
    /// Recorded as failed part-way (`success` false): the schema is in between. Refused.
    Failed,
}

impl MigrationState {
    /// How `db status` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationState::Applied => "applied",
            MigrationState::Pending => "pending",
            MigrationState::Newer => "newer",
            MigrationState::Unknown => "unknown",
            MigrationState::Differs => "differs",
            MigrationState::Failed => "failed",
        }
    }
}

/// One migration, this binary's or the database's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationEntry {
    pub version: i64,
    /// The database's description when it records the migration (`_sqlx_migrations`), else this binary's.
    pub description: String,
    pub state: MigrationState,
    /// When it was applied (Unix seconds), if it was.
    pub applied_at: Option<i64>,
}

/// Whether there is a schema to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// SQLite: no database file (read-only opens create none).
    NoDatabase,
    /// A database without `_sqlx_migrations`: never migrated.
    NoSchema,
    /// `_sqlx_migrations` is there.
    Recorded,
}

/// A database's schema against this binary's migrations.
#[derive(Debug, Clone)]
pub struct MigrationStatus {
    pub schema: SchemaState,
    /// Every migration this binary knows and every one the database records, in version order.
    pub migrations: Vec<MigrationEntry>,
    /// The versions this process applied as it opened the database (`Metadata::open`), in order.
    pub applied_now: Vec<i64>,
    /// The latest version this binary knows.
    latest_known: i64,
}

/// A migration this binary embeds, as the comparison needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known<'a> {
    pub version: i64,
    pub description: &'a str,
    pub checksum: &'a [u8],
}

/// A row of `_sqlx_migrations`.
#[derive(Debug, Clone)]
pub(super) struct AppliedRow {
    pub version: i64,
    pub description: String,
    pub success: bool,
    pub checksum: Vec<u8>,
    pub applied_at: Option<i64>,
}
from_row!(AppliedRow { version, description, success, checksum, applied_at });

/// Migrations named in a message: "migration 15 (object tags)", or "migrations 2 (a), 3 (b)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named(Vec<(i64, String)>);

impl<'a> FromIterator<&'a MigrationEntry> for Named {
    fn from_iter<I: IntoIterator<Item = &'a MigrationEntry>>(entries: I) -> Self {
        Named(entries.into_iter().map(|m| (m.version, m.description.clone())).collect())
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.len() == 1 { "migration " } else { "migrations " })?;
        for (i, (version, description)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{version} ({description})")?;
        }
        Ok(())
    }
}

/// A database this binary must not run on. Every message names the migrations and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the database records {0} as failed part-way, leaving the schema in between: repair it by hand and delete \
         its row from _sqlx_migrations, then run `blobgate db migrate` (`blobgate db status` lists the migrations)"
    )]
    Failed(Named),
    #[error(
        "the database records {0} with another checksum than this release's (another build's migration): run the \
         release that applied it, or restore a backup from before it (`blobgate db status` lists the migrations)"
    )]
    Differs(Named),
    #[error(
        "the database has {0}, which this release does not know, below its latest ({1}): another line of releases \
         migrated it; run one of those, or restore a backup from before it (`blobgate db status` lists the \
         migrations)"
    )]
    Unknown(Named, i64),
    #[error(
        "the database lacks this release's {0} but has the later {1}: another line of releases migrated it; run one \
         of those, or restore a backup from before it (`blobgate db status` lists the migrations)"
    )]
    Skipped(Named, Named),
}

impl MigrationStatus {
    /// Compares what this binary knows with what the database records (`None`: no `_sqlx_migrations`).
    pub(super) fn compare(known: &[Known<'_>], recorded: Option<&[AppliedRow]>) -> Self {
        let latest_known = known.iter().map(|k| k.version).max().unwrap_or(0);
        let rows = recorded.unwrap_or_default();
        let mut migrations: Vec<MigrationEntry> = known
            .iter()
            .map(|k| match rows.iter().find(|r| r.version == k.version) {
                None => MigrationEntry {
                    version: k.version,
                    description: k.description.to_owned(),
                    state: MigrationState::Pending,
                    applied_at: None,
                },
                Some(row) => {
                    let state = if !row.success {
                        MigrationState::Failed
                    } else if row.checksum != k.checksum {
                        MigrationState::Differs
                    } else {
                        MigrationState::Applied
                    };
                    MigrationEntry { state, ..entry(row) }
                }
            })
            .collect();
        for row in rows.iter().filter(|r| !known.iter().any(|k| k.version == r.version)) {
            let state = if !row.success {
                MigrationState::Failed
            } else if row.version > latest_known {
                MigrationState::Newer
            } else {
                MigrationState::Unknown
            };
            migrations.push(MigrationEntry { state, ..entry(row) });
        }
        migrations.sort_by_key(|m| m.version);
        let schema = if recorded.is_some() { SchemaState::Recorded } else { SchemaState::NoSchema };
        Self { schema, migrations, applied_now: Vec::new(), latest_known }
    }

    /// Every migration of `migrator` pending: a database that does not exist yet.
    fn no_database(migrator: &Migrator) -> Self {
        Self { schema: SchemaState::NoDatabase, ..Self::compare(&known(migrator), None) }
    }

    fn in_state(&self, state: MigrationState) -> impl Iterator<Item = &MigrationEntry> {
        self.migrations.iter().filter(move |m| m.state == state)
    }

    /// The latest migration this binary knows.
    pub fn latest_known(&self) -> i64 {
        self.latest_known
    }

    /// This binary's migrations that the database lacks.
    pub fn pending(&self) -> impl Iterator<Item = &MigrationEntry> {
        self.in_state(MigrationState::Pending)
    }

    /// Why this binary must not run on the database, if it must not. Checked in this order: a migration that
    /// failed part-way, one of ours changed, an unknown one below our latest, one of ours skipped.
    pub fn refusal(&self) -> Option<SchemaError> {
        let named = |state| Some(self.in_state(state).collect::<Named>()).filter(|n| !n.0.is_empty());
        if let Some(failed) = named(MigrationState::Failed) {
            return Some(SchemaError::Failed(failed));
        }
        if let Some(differs) = named(MigrationState::Differs) {
            return Some(SchemaError::Differs(differs));
        }
        if let Some(unknown) = named(MigrationState::Unknown) {
            return Some(SchemaError::Unknown(unknown, self.latest_known));
        }
        let applied = |m: &&MigrationEntry| m.state != MigrationState::Pending;
        let last_applied = self.migrations.iter().filter(applied).map(|m| m.version).max()?;
        let skipped: Named = self.pending().filter(|m| m.version < last_applied).collect();
        let first_skipped = skipped.0.first()?.0;
        let later = self.migrations.iter().filter(applied).find(|m| m.version > first_skipped)?;
        Some(SchemaError::Skipped(skipped, std::iter::once(later).collect()))
    }

    /// The migrations a newer release applied, if any, said in one line (`serve` logs it as a warning).
    pub fn newer_note(&self) -> Option<String> {
        let newer: Named = self.in_state(MigrationState::Newer).collect();
        (!newer.0.is_empty()).then(|| format!("the database has {newer} from a newer release, unknown to this one"))
    }

    /// Whether a command may read the database as it is: an error saying why not (no schema yet, or another
    /// line of releases), in one line. Pending migrations are the caller's to apply.
    pub fn check(&self, database: &DatabaseUrl) -> anyhow::Result<()> {
        if let Some(line) = self.unmigrated(database) {
            return Err(anyhow::Error::msg(line));
        }
        self.refusal().map_or(Ok(()), |refusal| Err(refused(refusal, database)))
    }

    /// Why a command that reads cannot read the database yet (no database, or no schema in it), in one line
    /// naming the commands that create it.
    pub fn unmigrated(&self, database: &DatabaseUrl) -> Option<String> {
        match (self.schema, database) {
            (SchemaState::NoDatabase, DatabaseUrl::Sqlite(path)) => Some(no_database_at(path)),
            (SchemaState::Recorded, _) => None,
            _ => Some(format!("{database} has no schema yet: {CREATES_IT}")),
        }
    }
}

/// A refusal as every command says it: naming the database.
pub(super) fn refused(refusal: SchemaError, database: &DatabaseUrl) -> anyhow::Error {
    anyhow::Error::new(refusal).context(database.to_string())
}

fn entry(row: &AppliedRow) -> MigrationEntry {
    MigrationEntry {
        version: row.version,
        description: row.description.clone(),
        state: MigrationState::Applied,
        applied_at: row.applied_at,
    }
}

/// The one-line answer to a read-only command on a data dir without its SQLite database.
pub(super) fn no_database_at(path: &std::path::Path) -> String {
    format!("no database at {} yet: {CREATES_IT}", path.display())
}

fn known(migrator: &Migrator) -> Vec<Known<'_>> {
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| Known { version: m.version, description: &m.description, checksum: &m.checksum })
        .collect()
}

/// Each dialect's questions to `_sqlx_migrations`: whether it exists, and its rows with the time they were
/// applied as Unix seconds (SQLite stores text, PostgreSQL a `timestamptz`).
struct Dialect {
    exists: &'static str,
    rows: &'static str,
}

const SQLITE: Dialect = Dialect {
    exists: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')",
    rows: "SELECT version, description, success, checksum, \
           CAST(strftime('%s', installed_on) AS INTEGER) AS applied_at FROM _sqlx_migrations ORDER BY version",
};

const POSTGRES: Dialect = Dialect {
    // Resolved as sqlx resolves the unqualified name it creates: along the search_path.
    exists: "SELECT to_regclass('_sqlx_migrations') IS NOT NULL",
    rows: "SELECT version, description, success, checksum, \
           CAST(extract(epoch FROM installed_on) AS BIGINT) AS applied_at FROM _sqlx_migrations ORDER BY version",
};

/// `_sqlx_migrations`' rows on a connection of either backend (`None`: there is no such table). A macro, as
/// `with_pool!`: the same code, type-checked per database.
macro_rules! recorded {
    ($conn:expr, $dialect:expr) => {
        async {
            let exists: bool = sqlx::query_scalar($dialect.exists).fetch_one(&mut *$conn).await?;
            if !exists {
                return Ok::<_, sqlx::Error>(None);
            }
            Ok(Some(sqlx::query_as::<_, AppliedRow>($dialect.rows).fetch_all(&mut *$conn).await?))
        }
    };
}

impl Metadata {
    /// The database's migrations against this binary's, as read when it was opened (`open` reads them after
    /// migrating).
    pub fn migrations(&self) -> &MigrationStatus {
        &self.migrations
    }

    /// Reads the database's migrations now.
    pub(super) async fn read_migrations(backend: &Backend) -> Result<MigrationStatus, MetadataError> {
        Ok(match backend {
            Backend::Sqlite(pool) => {
                let mut conn = pool.acquire().await?;
                MigrationStatus::compare(&known(&MIGRATOR), recorded!(conn, SQLITE).await?.as_deref())
            }
            Backend::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                MigrationStatus::compare(&known(&PG_MIGRATOR), recorded!(conn, POSTGRES).await?.as_deref())
            }
        })
    }

    /// The migrations of `database`, read without creating or changing anything: a missing SQLite database has
    /// every migration pending (for `db status`).
    pub async fn migration_status(
        database: &DatabaseUrl,
        timeouts: impl Into<crate::config::DatabaseTimeouts>,
    ) -> anyhow::Result<MigrationStatus> {
        if let DatabaseUrl::Sqlite(path) = database {
            if !path.exists() {
                return Ok(MigrationStatus::no_database(&MIGRATOR));
            }
        }
        let meta = Self::open_read_only(database, timeouts).await?;
        let status = meta.migrations().clone();
        meta.close().await;
        Ok(status)
    }
}

/// Applies this binary's pending migrations, first refusing a database from another line of releases (a
/// [`SchemaError`] in the chain), all under sqlx's migration lock (PostgreSQL: an advisory lock, so that
/// replicas starting together apply each migration once). Returns the status after.
pub(super) async fn migrate(backend: &Backend) -> anyhow::Result<MigrationStatus> {
    match backend {
        Backend::Sqlite(pool) => {
            let mut conn = pool.acquire().await?;
            migrate_locked(&mut *conn, &MIGRATOR, async |conn: &mut sqlx::SqliteConnection| {
                recorded!(conn, SQLITE).await
            })
            .await
        }
        Backend::Postgres(pool) => {
            // A session of its own: a migration that fails part-way cannot leave the lock with a pooled connection.
            let mut conn = pool.connect_options().connect().await?;
            let migrated = migrate_locked(&mut conn, &PG_MIGRATOR, async |conn: &mut sqlx::PgConnection| {
                recorded!(conn, POSTGRES).await
            })
            .await;
            conn.close().await.ok();
            migrated
        }
    }
}

/// sqlx's `Migrator::run`, with our comparison instead of its own: it refuses every applied migration it does
/// not know, a newer release's included.
async fn migrate_locked<C: Migrate>(
    conn: &mut C,
    migrator: &Migrator,
    recorded: impl AsyncFn(&mut C) -> Result<Option<Vec<AppliedRow>>, sqlx::Error>,
) -> anyhow::Result<MigrationStatus> {
    let known = known(migrator);
    conn.lock().await?;
    let migrated = async {
        // Only when it is missing: PostgreSQL answers `CREATE TABLE IF NOT EXISTS` on an existing table with a
        // notice, which would be one more line on stderr at every start.
        let before = match recorded(conn).await? {
            Some(rows) => MigrationStatus::compare(&known, Some(&rows)),
            None => {
                conn.ensure_migrations_table().await?;
                MigrationStatus::compare(&known, Some(&[]))
            }
        };
        if let Some(refusal) = before.refusal() {
            return Err(anyhow::Error::new(refusal));
        }
        let mut applied_now = Vec::new();
        for migration in migrator.iter().filter(|m| before.pending().any(|p| p.version == m.version)) {
            conn.apply(migration).await?;
            applied_now.push(migration.version);
        }
        let after = MigrationStatus::compare(&known, recorded(conn).await?.as_deref());
        Ok(MigrationStatus { applied_now, ..after })
    }
    .await;
    conn.unlock().await?;
    migrated
}

#[cfg(test)]
mod tests {
    use super::*;
    use MigrationState::*;

    const KNOWN: [Known<'static>; 3] = [
        Known { version: 1, description: "schema", checksum: b"one" },
        Known { version: 10, description: "s3 keys", checksum: b"ten" },
        Known { version: 11, description: "multipart", checksum: b"eleven" },
    ];

    fn row(version: i64, description: &str, checksum: &[u8]) -> AppliedRow {
        AppliedRow {
            version,
            description: description.into(),
            success: true,
            checksum: checksum.into(),
            applied_at: Some(1_700_000_000 + version),
        }
    }

    fn states(status: &MigrationStatus) -> Vec<(i64, MigrationState)> {
        status.migrations.iter().map(|m| (m.version, m.state)).collect()
    }

    #[test]
    fn a_database_without_a_schema_has_every_migration_pending() {
        let status = MigrationStatus::compare(&KNOWN, None);
        assert_eq!(status.schema, SchemaState::NoSchema);
        assert_eq!(states(&status), [(1, Pending), (10, Pending), (11, Pending)]);
        assert_eq!(status.refusal(), None);
        assert_eq!(status.newer_note(), None);
        let sqlite = DatabaseUrl::Sqlite("/srv/bg/blobgate.db".into());
        let line = status.unmigrated(&sqlite).unwrap();
        assert_eq!(line, format!("SQLite database /srv/bg/blobgate.db has no schema yet: {CREATES_IT}"));
        let missing = MigrationStatus { schema: SchemaState::NoDatabase, ..status };
        assert_eq!(
            missing.unmigrated(&sqlite).unwrap(),
            format!("no database at /srv/bg/blobgate.db yet: {CREATES_IT}")
        );
    }

    #[test]
    fn an_older_database_has_the_later_migrations_pending() {
        let rows = [row(1, "schema", b"one"), row(10, "s3 keys", b"ten")];
        let status = MigrationStatus::compare(&KNOWN, Some(&rows));
        assert_eq!(states(&status), [(1, Applied), (10, Applied), (11, Pending)]);
        assert_eq!(status.pending().map(|m| m.version).collect::<Vec<_>>(), [11]);
        assert_eq!(status.migrations[0].applied_at, Some(1_700_000_001));
        assert_eq!((status.refusal(), status.unmigrated(&DatabaseUrl::Sqlite("/x".into()))), (None, None));
    }

    #[test]
    fn later_migrations_of_a_newer_release_are_tolerated_and_named() {
        let rows = [
            row(1, "schema", b"one"),
            row(10, "s3 keys", b"ten"),
            row(11, "multipart", b"eleven"),
            row(12, "created by", b"twelve"),
            row(14, "quotas", b"fourteen"),
        ];
        let status = MigrationStatus::compare(&KNOWN, Some(&rows));
        assert_eq!(states(&status), [(1, Applied), (10, Applied), (11, Applied), (12, Newer), (14, Newer)]);
        assert_eq!(status.refusal(), None);
        assert_eq!(status.pending().count(), 0);
        assert_eq!(
            status.newer_note().unwrap(),
            "the database has migrations 12 (created by), 14 (quotas) from a newer release, unknown to this one"
        );
        assert_eq!(status.migrations[3].description, "created by", "the database's description");
    }

    #[test]
    fn another_line_of_releases_is_refused_naming_the_migrations() {
        let base = [row(1, "schema", b"one"), row(10, "s3 keys", b"ten"), row(11, "multipart", b"eleven")];
        let refusal = |rows: &[AppliedRow]| MigrationStatus::compare(&KNOWN, Some(rows)).refusal();

        // Unknown below our latest: in a gap, or below the first.
        let mut gap = base.to_vec();
        gap.insert(1, row(5, "hotfix", b"five"));
        let err = refusal(&gap).unwrap();
        assert_eq!(err, SchemaError::Unknown(Named(vec![(5, "hotfix".into())]), 11));
        assert!(
            err.to_string().starts_with(
                "the database has migration 5 (hotfix), which this release does not know, below its latest (11): "
            ),
            "{err}"
        );
        let mut below = base.to_vec();
        below.insert(0, row(0, "zero", b"zero"));
        assert!(matches!(refusal(&below), Some(SchemaError::Unknown(..))));

        // One of ours with another checksum.
        let mut changed = base.to_vec();
        changed[2].checksum = b"other".to_vec();
        let err = refusal(&changed).unwrap();
        assert_eq!(err, SchemaError::Differs(Named(vec![(11, "multipart".into())])));
        assert!(
            err.to_string().starts_with("the database records migration 11 (multipart) with another checksum"),
            "{err}"
        );

        // One of ours skipped under a later one, ours or not.
        let skipped = [row(1, "schema", b"one"), row(11, "multipart", b"eleven")];
        let err = refusal(&skipped).unwrap();
        assert_eq!(
            err,
            SchemaError::Skipped(Named(vec![(10, "s3 keys".into())]), Named(vec![(11, "multipart".into())]))
        );
        assert!(
            err.to_string().starts_with(
                "the database lacks this release's migration 10 (s3 keys) but has the later migration 11 (multipart): "
            ),
            "{err}"
        );
        let sibling = [row(1, "schema", b"one"), row(10, "s3 keys", b"ten"), row(12, "sibling", b"twelve")];
        let err = refusal(&sibling).unwrap();
        assert_eq!(
            err,
            SchemaError::Skipped(Named(vec![(11, "multipart".into())]), Named(vec![(12, "sibling".into())]))
        );

        // Failed part-way, ours or a newer one: first of all.
        let mut failed = base.to_vec();
        failed.push(AppliedRow { success: false, ..row(12, "newer", b"twelve") });
        failed[2].checksum = b"other".to_vec();
        let err = refusal(&failed).unwrap();
        assert_eq!(err, SchemaError::Failed(Named(vec![(12, "newer".into())])));
        assert!(err.to_string().contains("`blobgate db migrate`"), "{err}");

        // Every refusal is one line and points at `db status`.
        for err in [refusal(&gap), refusal(&changed), refusal(&skipped), refusal(&failed)] {
            let line = err.unwrap().to_string();
            assert!(!line.contains('\n') && line.ends_with("(`blobgate db status` lists the migrations)"), "{line}");
        }
    }

    #[test]
    fn every_migration_file_is_embedded_as_sqlx_reads_it() {
        // `resolve_blocking` is what `sqlx::migrate!` runs at build time: the same migrations, checksums included,
        // so a database migrated by a build with that macro compares equal.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for (dir, migrator) in [("migrations", &MIGRATOR), ("migrations/postgres", &PG_MIGRATOR)] {
            let read = sqlx::migrate::resolve_blocking(&root.join(dir)).unwrap();
            let shown = |m: &Migration| (m.version, m.description.to_string(), m.migration_type, m.no_tx);
            let files: Vec<_> = read.iter().map(|(m, _)| (shown(m), &m.sql, &m.checksum)).collect();
            let embedded: Vec<_> = migrator.iter().map(|m| (shown(m), &m.sql, &m.checksum)).collect();
            assert_eq!(embedded, files, "{dir}: list every file in migration_files!, in order");
        }
    }

    #[test]
    fn the_embedded_migrations_are_in_order_with_distinct_versions() {
        for migrator in [&MIGRATOR, &PG_MIGRATOR] {
            let versions: Vec<i64> = known(migrator).iter().map(|k| k.version).collect();
            assert!(!versions.is_empty() && versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        }
    }
}
