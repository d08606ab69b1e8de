//! The schema exists three times: the SQLite migrations (`migrations/`), the PostgreSQL ones
//! (`migrations/postgres/`) and the column lists of `db copy` (`src/store/metadata/copy.rs`). These tests migrate
//! a fresh database of each kind with `blobgate db migrate` and compare what they hold (tables, columns, types,
//! nullability, defaults, indexes, foreign keys); then they fill every column of every SQLite table, move it with
//! `blobgate db copy` to PostgreSQL, and compare every value. Intended differences are listed below, each with
//! its reason; a listed difference that went away fails too, so the lists stay true.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use sqlx::{Connection, PgConnection, Row, SqliteConnection};

use crate::helpers::*;

/// A column's type in both backends' terms. SQLite's declared types map as `INTEGER` ↔ `bigint` (both 64-bit;
/// a PostgreSQL `integer` could not hold every SQLite value, so it maps to nothing), `TEXT` ↔ `text`, `BLOB` ↔
/// `bytea`; PostgreSQL's `boolean` has no SQLite type. Anything else is kept as written and matches nothing on the
/// other side. Collations (PostgreSQL's `COLLATE "C"` keys) and CHECK constraints are not compared: they decide
/// order and which values are accepted, not which columns exist or what they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Type {
    Integer,
    Text,
    Bytes,
    Boolean,
    Other(String),
}

impl Type {
    fn sqlite(declared: &str) -> Type {
        match declared.to_ascii_uppercase().as_str() {
            "INTEGER" => Type::Integer,
            "TEXT" => Type::Text,
            "BLOB" => Type::Bytes,
            _ => Type::Other(declared.to_owned()),
        }
    }

    fn postgres(data_type: &str) -> Type {
        match data_type {
            "bigint" => Type::Integer,
            "text" => Type::Text,
            "bytea" => Type::Bytes,
            "boolean" => Type::Boolean,
            _ => Type::Other(data_type.to_owned()),
        }
    }
}

#[derive(Debug, Clone)]
struct Column {
    ty: Type,
    not_null: bool,
    /// The default as text, without PostgreSQL's casts (`''::text` is `''`); `None` for none and for `auto`.
    default: Option<String>,
    /// The database assigns it: SQLite's `INTEGER PRIMARY KEY` (the rowid), PostgreSQL's identity or serial.
    auto: bool,
}

/// An index by what identifies it across backends: a primary key or a UNIQUE constraint by its table and columns
/// (their names are generated, and differ), a created index by its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum IndexId {
    PrimaryKey { table: String, columns: Vec<String> },
    Unique { table: String, columns: Vec<String> },
    Named(String),
}

/// A created index's table, columns, uniqueness and partial predicate (normalised: lower case, no parentheses).
#[derive(Debug, Clone, PartialEq, Eq)]
struct IndexShape {
    table: String,
    columns: Vec<String>,
    unique: bool,
    predicate: Option<String>,
}

/// A foreign key: (table, columns) → (table, columns), and what deleting the parent does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ForeignKey {
    table: String,
    columns: Vec<String>,
    parent: String,
    parent_columns: Vec<String>,
    on_delete: String,
}

#[derive(Debug, Default)]
struct Schema {
    tables: BTreeMap<String, BTreeMap<String, Column>>,
    indexes: BTreeMap<IndexId, Option<IndexShape>>,
    foreign_keys: BTreeSet<ForeignKey>,
}

/// sqlx's bookkeeping, not the product's schema; `sqlite_*` tables are SQLite's own (`sqlite_sequence`).
fn is_product_table(name: &str) -> bool {
    name != "_sqlx_migrations" && !name.starts_with("sqlite_")
}

fn normalise_predicate(predicate: &str) -> String {
    let bare: String = predicate.chars().filter(|c| !matches!(c, '(' | ')')).collect();
    bare.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// `''::text` → `''`, `'x'::character varying` → `'x'`: PostgreSQL shows a default with its cast.
fn strip_casts(default: &str) -> String {
    match default.rfind("::") {
        Some(at) if default[at + 2..].chars().all(|c| c.is_ascii_alphabetic() || c == ' ') => {
            strip_casts(&default[..at])
        }
        _ => default.to_owned(),
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
}

fn sqlite_url(env: &TestEnv) -> String {
    format!("sqlite://{}", env.data_dir().join("blobgate.db").display())
}

async fn sqlite_schema(conn: &mut SqliteConnection) -> Schema {
    let mut schema = Schema::default();
    let tables: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, wr FROM pragma_table_list WHERE schema = 'main' AND type = 'table'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    for (table, without_rowid) in tables.into_iter().filter(|(t, _)| is_product_table(t)) {
        let rows = sqlx::query(r#"SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info($1)"#)
            .bind(&table)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let mut primary: Vec<(i64, String)> =
            rows.iter().filter(|r| r.get::<i64, _>("pk") > 0).map(|r| (r.get("pk"), r.get("name"))).collect();
        primary.sort();
        let primary: Vec<String> = primary.into_iter().map(|(_, name)| name).collect();
        let mut columns = BTreeMap::new();
        for row in &rows {
            let name: String = row.get("name");
            let declared: String = row.get("type");
            // The rowid alias: a rowid table's one-column INTEGER PRIMARY KEY. It is never NULL; a WITHOUT ROWID
            // table's key columns are NOT NULL too. (A rowid table's other key columns may hold NULL.)
            let rowid = without_rowid == 0 && primary == [name.clone()] && declared.eq_ignore_ascii_case("INTEGER");
            let in_key = primary.contains(&name);
            let not_null = row.get::<i64, _>("notnull") == 1 || rowid || (in_key && without_rowid == 1);
            let default = row.get::<Option<String>, _>("dflt_value");
            columns.insert(name, Column { ty: Type::sqlite(&declared), not_null, default, auto: rowid });
        }
        if !primary.is_empty() {
            schema.indexes.insert(IndexId::PrimaryKey { table: table.clone(), columns: primary }, None);
        }
        let indexes: Vec<(String, i64, String)> =
            sqlx::query_as(r#"SELECT name, "unique", origin FROM pragma_index_list($1)"#)
                .bind(&table)
                .fetch_all(&mut *conn)
                .await
                .unwrap();
        for (index, unique, origin) in indexes {
            let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_index_info($1) ORDER BY seqno")
                .bind(&index)
                .fetch_all(&mut *conn)
                .await
                .unwrap();
            match origin.as_str() {
                // The primary key is read from the columns above (an INTEGER PRIMARY KEY has no index).
                "pk" => {}
                "u" => {
                    schema.indexes.insert(IndexId::Unique { table: table.clone(), columns }, None);
                }
                _ => {
                    let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = $1")
                        .bind(&index)
                        .fetch_one(&mut *conn)
                        .await
                        .unwrap();
                    let predicate = sql.to_lowercase().split_once(" where ").map(|(_, p)| normalise_predicate(p));
                    let shape = IndexShape { table: table.clone(), columns, unique: unique == 1, predicate };
                    schema.indexes.insert(IndexId::Named(index), Some(shape));
                }
            }
        }
        let keys = sqlx::query(r#"SELECT id, seq, "table", "from", "to", on_delete FROM pragma_foreign_key_list($1)"#)
            .bind(&table)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let mut by_id: BTreeMap<i64, ForeignKey> = BTreeMap::new();
        for key in keys {
            let fk = by_id.entry(key.get("id")).or_insert_with(|| ForeignKey {
                table: table.clone(),
                columns: Vec::new(),
                parent: key.get("table"),
                parent_columns: Vec::new(),
                on_delete: key.get::<String, _>("on_delete").to_uppercase(),
            });
            fk.columns.push(key.get("from"));
            fk.parent_columns.push(key.get("to"));
        }
        schema.foreign_keys.extend(by_id.into_values());
        schema.tables.insert(table, columns);
    }
    schema
}

async fn postgres_schema(conn: &mut PgConnection) -> Schema {
    let mut schema = Schema::default();
    let columns = sqlx::query(
        "SELECT c.table_name::text AS table_name, c.column_name::text AS column_name, c.data_type::text AS data_type,
                c.is_nullable = 'NO' AS not_null, c.column_default::text AS column_default,
                c.is_identity = 'YES' AS identity
         FROM information_schema.columns c
         JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for row in columns {
        let table: String = row.get("table_name");
        if !is_product_table(&table) {
            continue;
        }
        let default = row.get::<Option<String>, _>("column_default").map(|d| strip_casts(&d));
        let serial = default.as_deref().is_some_and(|d| d.starts_with("nextval("));
        let column = Column {
            ty: Type::postgres(row.get("data_type")),
            not_null: row.get("not_null"),
            default: default.filter(|_| !serial),
            auto: serial || row.get::<bool, _>("identity"),
        };
        schema.tables.entry(table).or_default().insert(row.get("column_name"), column);
    }
    let indexes = sqlx::query(
        "SELECT t.relname::text AS table_name, i.relname::text AS index_name, x.indisunique AS is_unique,
                x.indisprimary AS is_primary,
                EXISTS (SELECT 1 FROM pg_constraint k
                        WHERE k.conrelid = x.indrelid AND k.conindid = x.indexrelid AND k.contype = 'u') AS constraint_,
                pg_get_expr(x.indpred, x.indrelid) AS predicate,
                array(SELECT a.attname::text FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n) AS columns
         FROM pg_index x
         JOIN pg_class i ON i.oid = x.indexrelid
         JOIN pg_class t ON t.oid = x.indrelid
         JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = current_schema()",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for row in indexes {
        let table: String = row.get("table_name");
        if !is_product_table(&table) {
            continue;
        }
        let columns: Vec<String> = row.get("columns");
        let (id, shape) = if row.get("is_primary") {
            (IndexId::PrimaryKey { table, columns }, None)
        } else if row.get("constraint_") {
            (IndexId::Unique { table, columns }, None)
        } else {
            let predicate = row.get::<Option<String>, _>("predicate").map(|p| normalise_predicate(&p));
            let shape = IndexShape { table, columns, unique: row.get("is_unique"), predicate };
            (IndexId::Named(row.get("index_name")), Some(shape))
        };
        schema.indexes.insert(id, shape);
    }
    let keys = sqlx::query(
        "SELECT k.conrelid::regclass::text AS table_name, k.confrelid::regclass::text AS parent, k.confdeltype::text
                AS on_delete,
                array(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY AS c(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = c.attnum ORDER BY c.n) AS columns,
                array(SELECT a.attname::text FROM unnest(k.confkey) WITH ORDINALITY AS c(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = c.attnum ORDER BY c.n)
                AS parent_columns
         FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
         WHERE k.contype = 'f' AND n.nspname = current_schema()",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for key in keys {
        let on_delete = match key.get::<String, _>("on_delete").as_str() {
            "a" => "NO ACTION",
            "r" => "RESTRICT",
            "c" => "CASCADE",
            "n" => "SET NULL",
            "d" => "SET DEFAULT",
            other => panic!("pg_constraint.confdeltype {other}"),
        };
        schema.foreign_keys.insert(ForeignKey {
            table: key.get("table_name"),
            columns: key.get("columns"),
            parent: key.get("parent"),
            parent_columns: key.get("parent_columns"),
            on_delete: on_delete.to_owned(),
        });
    }
    schema
}

/// Why the PostgreSQL schema has what SQLite's has not, or has it otherwise: (what differs, the reason). `what`
/// is exactly the difference `differences` reports.
const INTENDED: &[(&str, &str)] = &[
    (
        "buckets.public: type: SQLite Integer, PostgreSQL Boolean",
        "SQLite has no boolean: an INTEGER with CHECK (public IN (0, 1)) there",
    ),
    ("buckets.public: default: SQLite Some(\"0\"), PostgreSQL Some(\"false\")", "the same default: false is 0"),
    (
        "signing_keys.rowid: only in PostgreSQL",
        "stands in for SQLite's implicit rowid: insertion order, which breaks ties between keys of the same second",
    ),
    ("signing_keys: UNIQUE (rowid): only in PostgreSQL", "the stand-in rowid is unique, as SQLite's is"),
    ("tokens.id: not null: SQLite false, PostgreSQL true", ROWID_KEY_QUIRK),
    ("signing_keys.id: not null: SQLite false, PostgreSQL true", ROWID_KEY_QUIRK),
    ("revoked_signatures.signature: not null: SQLite false, PostgreSQL true", ROWID_KEY_QUIRK),
    ("s3_keys.id: not null: SQLite false, PostgreSQL true", ROWID_KEY_QUIRK),
    (
        "cache_changes.created_at: only in PostgreSQL",
        "replicas may lag, so PostgreSQL prunes the change log by age; SQLite prunes what this server applied",
    ),
    (
        "cache_changes_horizon: only in PostgreSQL",
        "how far PostgreSQL's age-based pruning went, so that a lagging replica knows it missed changes",
    ),
];

/// SQLite lets a rowid table's non-INTEGER PRIMARY KEY column hold NULL (a legacy quirk, kept for compatibility:
/// sqlite.org/lang_createtable.html); every insert names the key, so no NULL is ever written.
const ROWID_KEY_QUIRK: &str = "SQLite's rowid tables allow NULL in a TEXT PRIMARY KEY; every insert names it";

/// Every difference between the two schemas, one line each, in the form `INTENDED` lists.
fn differences(sqlite: &Schema, postgres: &Schema) -> Vec<String> {
    let mut found = Vec::new();
    let tables: BTreeSet<&String> = sqlite.tables.keys().chain(postgres.tables.keys()).collect();
    for table in tables {
        let (Some(s), Some(p)) = (sqlite.tables.get(table), postgres.tables.get(table)) else {
            let side = if sqlite.tables.contains_key(table) { "SQLite" } else { "PostgreSQL" };
            found.push(format!("{table}: only in {side}"));
            continue;
        };
        let columns: BTreeSet<&String> = s.keys().chain(p.keys()).collect();
        for column in columns {
            let (Some(s), Some(p)) = (s.get(column), p.get(column)) else {
                let side = if s.contains_key(column) { "SQLite" } else { "PostgreSQL" };
                found.push(format!("{table}.{column}: only in {side}"));
                continue;
            };
            let mut differ = |aspect: &str, a: String, b: String| {
                if a != b {
                    found.push(format!("{table}.{column}: {aspect}: SQLite {a}, PostgreSQL {b}"));
                }
            };
            differ("type", format!("{:?}", s.ty), format!("{:?}", p.ty));
            differ("not null", s.not_null.to_string(), p.not_null.to_string());
            differ("default", format!("{:?}", s.default), format!("{:?}", p.default));
            differ("assigned by the database", s.auto.to_string(), p.auto.to_string());
        }
    }
    let not_postgres_only = |t: &String| sqlite.tables.contains_key(t) || !postgres.tables.contains_key(t);
    let ids: BTreeSet<&IndexId> = sqlite.indexes.keys().chain(postgres.indexes.keys()).collect();
    for id in ids {
        let what = match id {
            IndexId::PrimaryKey { table, columns } if not_postgres_only(table) => {
                format!("{table}: PRIMARY KEY ({})", columns.join(", "))
            }
            IndexId::Unique { table, columns } if not_postgres_only(table) => {
                format!("{table}: UNIQUE ({})", columns.join(", "))
            }
            IndexId::Named(name) => format!("index {name}"),
            // A table only PostgreSQL has is reported once, as a table.
            _ => continue,
        };
        match (sqlite.indexes.get(id), postgres.indexes.get(id)) {
            (Some(a), Some(b)) if a != b => found.push(format!("{what}: SQLite {a:?}, PostgreSQL {b:?}")),
            (Some(_), None) => found.push(format!("{what}: only in SQLite")),
            (None, Some(_)) => found.push(format!("{what}: only in PostgreSQL")),
            _ => {}
        }
    }
    for key in sqlite.foreign_keys.symmetric_difference(&postgres.foreign_keys) {
        let side = if sqlite.foreign_keys.contains(key) { "SQLite" } else { "PostgreSQL" };
        found.push(format!(
            "{}: FOREIGN KEY ({}) REFERENCES {} ({}) ON DELETE {}: only in {side}",
            key.table,
            key.columns.join(", "),
            key.parent,
            key.parent_columns.join(", "),
            key.on_delete
        ));
    }
    found
}

/// The differences not listed as intended, and the intended ones that are gone.
fn unexplained(found: &[String]) -> Vec<String> {
    let intended: Vec<String> = INTENDED.iter().map(|(what, _)| what.to_string()).collect();
    let mut problems: Vec<String> = found
        .iter()
        .filter(|f| !intended.contains(f))
        .map(|f| format!("{f} (fix the migration that drifted, or list it in INTENDED with the reason)"))
        .collect();
    for gone in intended.iter().filter(|i| !found.contains(i)) {
        problems.push(format!("INTENDED lists \"{gone}\", which the schemas no longer differ in: remove it"));
    }
    problems
}

/// Both schemas as `blobgate db migrate` leaves them: (SQLite env, PostgreSQL env).
fn migrated() -> (TestEnv, TestEnv) {
    let (sqlite, postgres) = (TestEnv::new(), TestEnv::on_postgres());
    for env in [&sqlite, &postgres] {
        std::fs::create_dir(env.data_dir()).unwrap();
        let out = env.ok(&["db", "migrate"]);
        assert!(!out.is_empty(), "db migrate applied nothing to a fresh database");
    }
    (sqlite, postgres)
}

fn read_schemas(sqlite: &TestEnv, postgres: &TestEnv) -> (Schema, Schema) {
    block_on(async {
        let mut s = SqliteConnection::connect(&sqlite_url(sqlite)).await.expect("open the SQLite database");
        let mut p = PgConnection::connect(postgres.database_url.as_ref().unwrap()).await.expect("connect");
        let schemas = (sqlite_schema(&mut s).await, postgres_schema(&mut p).await);
        s.close().await.unwrap();
        p.close().await.unwrap();
        schemas
    })
}

#[test]
fn both_migration_sets_build_the_same_schema() {
    let (sqlite, postgres) = migrated();
    let (s, p) = read_schemas(&sqlite, &postgres);
    assert!(s.tables.len() > 10 && s.tables.contains_key("objects"), "SQLite tables: {:?}", s.tables.keys());
    let problems = unexplained(&differences(&s, &p));
    assert!(problems.is_empty(), "{} schema differences:\n{}", problems.len(), problems.join("\n"));
}

/// The comparison sees a column one backend lacks, an index one backend lacks, and a changed nullability: here a
/// migration "forgot" each, done by hand on a migrated database.
#[test]
fn a_column_or_index_missing_in_one_backend_is_reported() {
    let (sqlite, postgres) = migrated();
    block_on(async {
        let mut p = PgConnection::connect(postgres.database_url.as_ref().unwrap()).await.unwrap();
        sqlx::raw_sql("ALTER TABLE buckets DROP COLUMN error_document; ALTER TABLE objects ALTER size DROP NOT NULL")
            .execute(&mut p)
            .await
            .unwrap();
        let mut s = SqliteConnection::connect(&sqlite_url(&sqlite)).await.unwrap();
        sqlx::raw_sql("DROP INDEX objects_by_sha256").execute(&mut s).await.unwrap();
    });
    let (s, p) = read_schemas(&sqlite, &postgres);
    let problems = unexplained(&differences(&s, &p));
    let fix = "(fix the migration that drifted, or list it in INTENDED with the reason)";
    assert_eq!(
        problems,
        [
            format!("buckets.error_document: only in SQLite {fix}"),
            format!("objects.size: not null: SQLite true, PostgreSQL false {fix}"),
            format!("index objects_by_sha256: only in PostgreSQL {fix}"),
        ]
    );
}

/// What `db copy` leaves behind on purpose: (a table, or `table.column`; the reason).
const NOT_COPIED: &[(&str, &str)] = &[
    ("cache_changes", "the target's triggers log every copied row, so replicas on the target evict what they cached"),
    (
        "stats_flush_marks",
        "a mark is one process's stats batch in doubt on the source; writer ids are random per process, so no \
         process writing to the target can hold one",
    ),
    (
        "stats_ledger",
        "download counters not folded yet: the copy adds them to the object_stats and object_stats_daily rows it \
         copies, so the target starts with everything folded",
    ),
    ("stats_fold", "the fold's cursor over the source's ledger, which is not copied (the target's starts idle)"),
    (
        "store_blob_retirements",
        "when object-store blobs lost their last reference and when sweeps deleted them: the target's sweep finds \
         them unreferenced on its own",
    ),
    (
        "multipart_completions",
        "a CompleteMultipartUpload's answer, remembered on the source for a retry within minutes; no copy should \
         answer a retry sent to the source",
    ),
    (
        "multipart_uploads.completing_since",
        "a CompleteMultipartUpload's claim in progress on the source; no copy should carry it over",
    ),
];

/// A value as both backends can hold it: a boolean is its integer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

fn decode<'r, R: Row>(row: &'r R, i: usize, ty: &Type) -> Value
where
    usize: sqlx::ColumnIndex<R>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<bool>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let value = match ty {
        Type::Integer => row.get::<Option<i64>, _>(i).map(Value::Int),
        Type::Text => row.get::<Option<String>, _>(i).map(Value::Text),
        Type::Bytes => row.get::<Option<Vec<u8>>, _>(i).map(Value::Bytes),
        Type::Boolean => row.get::<Option<bool>, _>(i).map(|b| Value::Int(b.into())),
        Type::Other(t) => panic!("no decoding for the type {t}"),
    };
    value.unwrap_or(Value::Null)
}

/// Every SQLite table's rows, every column that gets a value, so that nothing is copied by accident of being
/// NULL; a new column must be given one here (`the_fixture_fills_every_column` says which).
fn fixture() -> String {
    let sha = |c: char| c.to_string().repeat(64);
    let bytes = |n: usize| format!("x'{}'", "00ff7f80".repeat(n / 4));
    let (a, b, c) = (sha('a'), sha('b'), sha('c'));
    let key = "dir/ünï code.txt";
    format!(
        "INSERT INTO buckets (id, name, public, created_at, default_cache_control, cors, index_document,
             error_document)
         VALUES (7, 'schema-bkt', 1, 1700000001, 'max-age=60', '[{{\"allowed_origins\":[\"*\"]}}]', 'index.html',
             '404.html');
         INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition,
             user_metadata, tags, created_at, updated_at)
         VALUES (7, '{key}', '{a}', 9007199254740993, 'text/plain', 'no-cache', 'attachment', '{{\"color\":\"blue\"}}',
             '{{\"team\":\"x\"}}', 1700000002, 1700000003);
         INSERT INTO object_s3_etags (bucket_id, key, sha256, etag, part_sizes, checksum)
             VALUES (7, '{key}', '{a}', '\"0123-2\"', '5242880,4', 'CRC32 COMPOSITE o8hrCg==-2');
         INSERT INTO object_variants (bucket_id, key, encoding, sha256, size) VALUES (7, '{key}', 'br', '{b}', 3);
         INSERT INTO tokens (id, secret_hash, bucket_id, prefix, scope, created_at, expires_at, revoked_at)
         VALUES ('tok-schema', {}, 7, 'dir/', 'read', 1700000004, 1700000005, 1700000006);
         INSERT INTO s3_keys (id, secret, bucket_id, prefix, scope, created_at, expires_at, revoked_at)
         VALUES ('AKBGSCHEMASCHEMA0001', {}, 7, 'dir/', 'write', 1700000007, 1700000008, 1700000009);
         INSERT INTO signing_keys (id, secret, created_at, retired_at) VALUES ('sk-schema', {}, 1700000010, 1700000011);
         INSERT INTO revoked_signatures (signature, expires_at, revoked_at) VALUES ('sig-schema', 1700000012, 1700000013);
         INSERT INTO object_stats (bucket_id, key, requests, completed, aborted, truncated, bytes_sent, range_requests,
             not_modified, head_requests, last_download_at)
         VALUES (7, '{key}', 11, 12, 13, 14, 9007199254740995, 16, 17, 18, 1700000014);
         INSERT INTO object_stats_daily (bucket_id, key, day, requests, completed, aborted, bytes_sent,
             range_requests, not_modified)
         VALUES (7, '{key}', '2026-12-02', 21, 22, 23, 24, 25, 26);
         INSERT INTO multipart_uploads (id, bucket_id, key, content_type, cache_control, content_disposition,
             created_at, completing_since, user_metadata, tags, created_by, checksum)
         VALUES ('0000018c-schema', 7, 'big.bin', 'application/x-big', 'private', 'inline', 1700000015, 1700000016,
             '{{\"a\":\"b\"}}', '{{\"c\":\"d\"}}', 'AKBGSCHEMASCHEMA0001', 'CRC32 COMPOSITE');
         INSERT INTO multipart_parts (upload_id, part_number, size, staged_name, md5, sha256, created_at, checksum)
         VALUES ('0000018c-schema', 1, 4, 'part-schema-1', '{}', '{c}', 1700000017, 'CRC32 FULL_OBJECT DUoRhQ==');
         INSERT INTO stats_flush_marks (writer, last_seq, updated_at) VALUES ('writer-schema', 42, 1700000018);
         INSERT INTO stats_ledger (id, bucket_id, key, day, requests, completed, aborted, truncated, bytes_sent,
             range_requests, not_modified, head_requests, last_download_at)
         VALUES (1, 7, '{key}', '2026-12-03', 31, 32, 33, 34, 35, 36, 37, 38, 1700000023);
         UPDATE stats_fold SET upto = 1, phase = 'deleting', done_bucket = 7, done_key = '{key}';
         INSERT INTO store_blob_retirements (sha256, retired_at, deleting_at, deleted_at)
             VALUES ('{c}', 1700000019, 1700000020, 1700000021);
         INSERT INTO multipart_completions (upload_id, bucket_id, key, sha256, etag, completed_at)
             VALUES ('0000018d-schema', 7, '{key}', '{a}', '\"0123-2\"', 1700000022);
         INSERT INTO principal_limits (subject_kind, subject_name, request_count, request_period_secs, request_burst,
             read_bytes_per_sec, read_burst_bytes, write_bytes_per_sec, write_burst_bytes, concurrent, ipv4_prefix,
             ipv6_prefix, weight, updated_at)
         VALUES ('anonymous', '', 6000, 60, 200, 10485760, 1048576, 5242880, 524288, 8, 24, 56, 3, 1700000024),
             ('bucket', 'schema-bkt', 5, 1, NULL, NULL, NULL, NULL, NULL, 2, NULL, NULL, NULL, 1700000025);",
        bytes(32),
        bytes(60),
        bytes(76),
        "d".repeat(32),
    )
}

/// `table`'s rows (sorted) in the given columns, each decoded as its type says.
async fn sqlite_rows(conn: &mut SqliteConnection, table: &str, columns: &[(&str, Type)]) -> Vec<Vec<Value>> {
    let sql = select(table, columns);
    let rows = sqlx::query(&sql).fetch_all(conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut rows: Vec<Vec<Value>> =
        rows.iter().map(|r| columns.iter().enumerate().map(|(i, (_, ty))| decode(r, i, ty)).collect()).collect();
    rows.sort();
    rows
}

async fn postgres_rows(conn: &mut PgConnection, table: &str, columns: &[(&str, Type)]) -> Vec<Vec<Value>> {
    let sql = select(table, columns);
    let rows = sqlx::query(&sql).fetch_all(conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut rows: Vec<Vec<Value>> =
        rows.iter().map(|r| columns.iter().enumerate().map(|(i, (_, ty))| decode(r, i, ty)).collect()).collect();
    rows.sort();
    rows
}

fn select(table: &str, columns: &[(&str, Type)]) -> String {
    let names: Vec<String> = columns.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    format!("SELECT {} FROM {table}", names.join(", "))
}

/// The SQLite env, migrated by `db migrate` and filled with `fixture()`, and a fresh PostgreSQL database it was
/// copied to by `db copy`.
fn filled_and_copied() -> (TestEnv, String) {
    let env = TestEnv::new();
    std::fs::create_dir(env.data_dir()).unwrap();
    env.ok(&["db", "migrate"]);
    // A write creates `signing-secrets.key`, without which a database holding sealed secrets is not opened.
    env.bucket("schema-keyholder", false);
    block_on(async {
        let mut conn = SqliteConnection::connect(&sqlite_url(&env)).await.unwrap();
        sqlx::raw_sql(&fixture()).execute(&mut conn).await.unwrap_or_else(|e| panic!("the fixture: {e}"));
        conn.close().await.unwrap();
    });
    let target = postgres_database();
    let out = env.ok(&["db", "copy", "--to", &target]);
    assert!(out.contains("\"copied\""), "db copy: {out}");
    (env, target)
}

/// Every value of every copied table that differs between SQLite and the copy; every column of the fixture
/// that holds no value; every `NOT_COPIED` entry that names nothing.
fn copy_problems(env: &TestEnv, target: &str) -> Vec<String> {
    block_on(async {
        let mut s = SqliteConnection::connect(&sqlite_url(env)).await.unwrap();
        let mut p = PgConnection::connect(target).await.unwrap();
        let (sqlite, postgres) = (sqlite_schema(&mut s).await, postgres_schema(&mut p).await);
        let mut problems = Vec::new();
        for (entry, _) in NOT_COPIED {
            let (table, column) = entry.split_once('.').map_or((*entry, None), |(t, c)| (t, Some(c)));
            let exists = sqlite.tables.get(table).is_some_and(|t| column.is_none_or(|c| t.contains_key(c)));
            if !exists {
                problems.push(format!("NOT_COPIED lists {entry}, which SQLite's schema does not have: remove it"));
            }
        }
        for (table, columns) in &sqlite.tables {
            for column in columns.keys() {
                let sql = format!("SELECT count(*) FROM {table} WHERE \"{column}\" IS NOT NULL");
                let filled: i64 = sqlx::query_scalar(&sql).fetch_one(&mut s).await.unwrap();
                if filled == 0 {
                    problems.push(format!(
                        "{table}.{column}: the fixture leaves it NULL in every row: give it a value in fixture()"
                    ));
                }
            }
            if NOT_COPIED.iter().any(|(entry, _)| entry == table) {
                continue;
            }
            let Some(target_columns) = postgres.tables.get(table) else {
                problems.push(format!("{table}: not in PostgreSQL (see both_migration_sets_build_the_same_schema)"));
                continue;
            };
            let names: Vec<&str> = columns
                .keys()
                .map(String::as_str)
                .filter(|c| !NOT_COPIED.iter().any(|(entry, _)| *entry == format!("{table}.{c}")))
                .filter(|c| target_columns.contains_key(*c))
                .collect();
            let typed = |schema: &BTreeMap<String, Column>| -> Vec<(&str, Type)> {
                names.iter().map(|c| (*c, schema[*c].ty.clone())).collect()
            };
            let source = sqlite_rows(&mut s, table, &typed(columns)).await;
            let copied = postgres_rows(&mut p, table, &typed(target_columns)).await;
            if source.len() != copied.len() {
                problems.push(format!(
                    "{table}: {} rows in SQLite, {} after db copy: add the table to TABLES in \
                     src/store/metadata/copy.rs (or to NOT_COPIED here, with the reason)",
                    source.len(),
                    copied.len()
                ));
                continue;
            }
            for (a, b) in source.iter().zip(&copied) {
                for ((name, x), y) in names.iter().zip(a).zip(b).filter(|((_, x), y)| x != y) {
                    problems.push(format!(
                        "{table}.{name}: SQLite {x:?}, after db copy {y:?}: add the column to its table in TABLES \
                         (src/store/metadata/copy.rs), or to NOT_COPIED here, with the reason"
                    ));
                }
            }
        }
        s.close().await.unwrap();
        p.close().await.unwrap();
        problems
    })
}

#[test]
fn db_copy_carries_every_column_of_every_table() {
    let (env, target) = filled_and_copied();
    let problems = copy_problems(&env, &target);
    assert!(problems.is_empty(), "{} problems with db copy:\n{}", problems.len(), problems.join("\n"));
}

/// The comparison sees a column and a table that the copy left behind: here the copy's target is changed by hand
/// afterwards, as a copy.rs that forgot them would have left it.
#[test]
fn a_column_or_table_left_behind_by_db_copy_is_reported() {
    let (env, target) = filled_and_copied();
    block_on(async {
        let mut p = PgConnection::connect(&target).await.unwrap();
        sqlx::raw_sql("UPDATE objects SET tags = NULL; DELETE FROM revoked_signatures").execute(&mut p).await.unwrap();
    });
    assert_eq!(
        copy_problems(&env, &target),
        [
            "objects.tags: SQLite Text(\"{\\\"team\\\":\\\"x\\\"}\"), after db copy Null: add the column to its table \
             in TABLES (src/store/metadata/copy.rs), or to NOT_COPIED here, with the reason",
            "revoked_signatures: 1 rows in SQLite, 0 after db copy: add the table to TABLES in \
             src/store/metadata/copy.rs (or to NOT_COPIED here, with the reason)",
        ]
    );
}
