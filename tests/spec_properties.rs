//! Property tests of what the operator does with the specs it is given: generated `Database` and
//! `DatabaseBackup` specs (valid ones, and invalid versions, sizes, schedules, time zones,
//! durations, retention, names, init SQL, credentials and S3 fields) go through deserialisation,
//! the Database's `decide`, `plan_backups`, `BackupSettings::parse`, the `DatabaseBackup`'s
//! `decide` and the builders. Each property prints how many generated cases it ran.
//!
//! What must hold: nothing panics; every condition, refusal and wait carries a message, and a
//! bad spec field is named in it; what the builders make for a Database that may proceed has
//! DNS names and dbop label values of at most 63 characters; the generated password appears in
//! no built object but the Secret.

use std::cell::Cell;
use std::fmt::Debug;

use chrono::{DateTime, TimeZone, Utc};
use dbop::api::conditions::ConditionType;
use dbop::api::{
    BackupPhase, BackupStatus, Database, DatabaseBackup, DatabaseBackupSpec, DatabaseBackupStatus,
    DatabaseSpec, DatabaseStatus, Phase,
};
use dbop::backup::job::backup_job;
use dbop::backup::plan::BackupHistory;
use dbop::backup::s3_secret::S3SecretProblem;
use dbop::backup::schedule::{BackupRecord, scheduled_backup_name};
use dbop::backup::settings::BackupSettings;
use dbop::database::decide::{Decision, decide};
use dbop::database::facts::{
    ClaimSize, ClassFact, CredentialsFact, Facts, InitJobFact, InitSourceFact, StatefulSetFact,
    StorageFact, VolumeFact,
};
use dbop::database_backup::decide::decide as decide_backup;
use dbop::database_backup::facts::{BackupFacts, DatabaseFacts, JobFacts};
use dbop::objects::JobState;
use dbop::resources::backup_job::job_name;
use dbop::resources::credentials::{SecretProblem, generated_secret};
use dbop::resources::init_job::{init_job, init_sql_config_map};
use dbop::resources::{check_version, services, statefulset};
use dbop::settings::Settings;
use dbop_contract::volume::VolumeUsage;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The runner: a fixed number of cases, no failure files, the count printed.

/// Runs `property` on `cases` generated inputs and returns how many ran.
fn check<T: Debug>(
    name: &str,
    cases: u32,
    strategy: impl Strategy<Value = T>,
    property: impl Fn(T) -> Result<(), TestCaseError>,
) -> u32 {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let count = Cell::new(0u32);
    let result = runner.run(&strategy, |input| {
        count.set(count.get() + 1);
        property(input)
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    println!("{name}: {} generated cases, all held", count.get());
    count.get()
}

// ---------------------------------------------------------------------------------------------
// Generators: each field valid (as the schema admits it) or not.

fn text(pattern: &'static str) -> BoxedStrategy<String> {
    proptest::string::string_regex(pattern)
        .expect("a valid pattern")
        .boxed()
}

fn listed(values: &'static [&'static str]) -> BoxedStrategy<String> {
    select(values).prop_map(str::to_string).boxed()
}

/// A JSON string field, or absent (`Value::Null` is dropped by `object`).
fn maybe(s: BoxedStrategy<String>) -> BoxedStrategy<Value> {
    prop_oneof![1 => Just(Value::Null), 2 => s.prop_map(Value::String)].boxed()
}

/// A JSON object without its null fields.
fn object(fields: Vec<(&str, Value)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn database_name() -> BoxedStrategy<String> {
    text("[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
}

fn k8s_name() -> BoxedStrategy<String> {
    text("[a-z0-9]([-a-z0-9]{0,60}[a-z0-9])?")
}

fn version(valid: bool) -> BoxedStrategy<String> {
    if valid {
        prop_oneof![3 => text("1[3-8]\\.[0-9]{1,2}"), 1 => text("[0-9]{1,3}\\.[0-9]{1,3}")].boxed()
    } else {
        prop_oneof![text("[0-9.+a-z -]{0,9}"), any::<String>()].boxed()
    }
}

fn size(valid: bool) -> BoxedStrategy<String> {
    if valid {
        text("[1-9][0-9]{0,3}(Ki|Mi|Gi|Ti|M|G)?")
    } else {
        prop_oneof![text("[-+0-9.eEkKMGTPim]{0,8}"), any::<String>()].boxed()
    }
}

fn duration(valid: bool) -> BoxedStrategy<String> {
    if valid {
        text("([0-9]{1,6}[smhdw]){1,3}")
    } else {
        prop_oneof![
            Just("0s".to_string()),
            text("[-0-9 smhdwy.]{0,8}"),
            text("[0-9]{15,22}[smhdw]"),
            any::<String>()
        ]
        .boxed()
    }
}

fn schedule(valid: bool) -> BoxedStrategy<String> {
    let known = listed(&[
        "0 2 * * *",
        "*/15 * * * *",
        "@daily",
        "@hourly",
        "@weekly",
        "@monthly",
        "@yearly",
        "30 3 * * 0",
        "30 3 * * 7",
        "0 0 1 * *",
        "0 0 29 2 *",
        "5 4 * * 1-5",
        "0 */6 * * *",
        "0 0 31 2 *",
        "0 2 * * SUN",
        "0 2 * * 5-0",
    ]);
    if valid {
        prop_oneof![3 => known, 2 => text("([0-9*/,-]{1,5} ){4}[0-9*/,-]{1,5}")].boxed()
    } else {
        prop_oneof![
            text("@[a-z]{0,8}"),
            text("([0-9A-Z*/,?#LW-]{0,4} ){0,6}[0-9*/,-]{0,4}"),
            any::<String>()
        ]
        .boxed()
    }
}

fn time_zone(valid: bool) -> BoxedStrategy<String> {
    let known = listed(&[
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
        "Etc/GMT+5",
        "Pacific/Chatham",
    ]);
    if valid {
        known
    } else {
        prop_oneof![
            text("[A-Za-z_+-]{1,10}(/[A-Za-z_+-]{1,10})?"),
            any::<String>()
        ]
        .boxed()
    }
}

/// Chooses the valid or the invalid generator of a field (mostly valid).
fn field(
    valid: bool,
    make: impl Fn(bool) -> BoxedStrategy<String> + 'static,
) -> BoxedStrategy<String> {
    if valid {
        make(true)
    } else {
        prop_oneof![3 => make(true), 1 => make(false)].boxed()
    }
}

fn retention(valid: bool) -> BoxedStrategy<Value> {
    let count = |max: u32| {
        if valid {
            prop_oneof![Just(Value::Null), (1..=max).prop_map(Value::from)].boxed()
        } else {
            prop_oneof![Just(Value::Null), any::<u32>().prop_map(Value::from)].boxed()
        }
    };
    let r = (count(10_000), maybe(field(valid, duration)), count(1000)).prop_map(
        |(keep_last, max_age, keep_failed)| {
            object(vec![
                ("keepLast", keep_last),
                ("maxAge", max_age),
                ("keepFailed", keep_failed),
            ])
        },
    );
    prop_oneof![Just(Value::Null), r].boxed()
}

fn key_ref() -> BoxedStrategy<Value> {
    (k8s_name(), text("[A-Za-z0-9._-]{1,20}"))
        .prop_map(|(name, key)| json!({"name": name, "key": key}))
        .boxed()
}

fn s3() -> BoxedStrategy<Value> {
    let ca = prop_oneof![
        2 => Just(Value::Null),
        1 => key_ref().prop_map(|r| json!({"secretKeyRef": r})),
        1 => key_ref().prop_map(|r| json!({"configMapKeyRef": r})),
    ];
    let credentials = (
        k8s_name(),
        maybe(text("[A-Za-z_]{1,20}")),
        maybe(text("[A-Za-z_]{1,20}")),
    )
        .prop_map(|(secret, id, key)| {
            object(vec![
                ("secretName", Value::String(secret)),
                ("accessKeyIdKey", id),
                ("secretAccessKeyKey", key),
            ])
        });
    (
        maybe(text("https?://[a-z0-9.-]{1,30}(:[0-9]{2,5})?")),
        text("[a-z0-9][a-z0-9.-]{1,40}[a-z0-9]"),
        maybe(text("[A-Za-z0-9!_.*'()/-]{0,40}")),
        maybe(listed(&["us-east-1", "eu-central-1", "garage"])),
        any::<bool>(),
        credentials,
        ca,
    )
        .prop_map(
            |(endpoint, bucket, prefix, region, path_style, creds, ca)| {
                object(vec![
                    ("endpoint", endpoint),
                    ("bucket", Value::String(bucket)),
                    ("prefix", prefix),
                    ("region", region),
                    ("forcePathStyle", Value::Bool(path_style)),
                    ("credentials", creds),
                    ("ca", ca),
                ])
            },
        )
        .boxed()
}

fn backup(valid: bool) -> BoxedStrategy<Value> {
    (
        field(valid, schedule),
        maybe(field(valid, time_zone)),
        any::<bool>(),
        (
            maybe(field(valid, duration)),
            maybe(field(valid, duration)),
            maybe(field(valid, duration)),
        ),
        s3(),
        retention(valid),
        any::<bool>(),
    )
        .prop_map(
            |(schedule, zone, suspend, (deadline, rpo, timeout), s3, retention, physical)| {
                // The API server takes method Physical only with WAL archiving.
                let (method, archiving) = if physical {
                    (json!("Physical"), json!({}))
                } else {
                    (Value::Null, Value::Null)
                };
                object(vec![
                    ("schedule", Value::String(schedule)),
                    ("method", method),
                    ("walArchiving", archiving),
                    ("timeZone", zone),
                    ("suspend", Value::Bool(suspend)),
                    ("startingDeadline", deadline),
                    ("rpo", rpo),
                    ("timeout", timeout),
                    ("s3", s3),
                    ("retention", retention),
                ])
            },
        )
        .boxed()
}

fn init() -> BoxedStrategy<Value> {
    prop_oneof![
        2 => Just(Value::Null),
        1 => any::<String>().prop_filter("non-empty", |s| !s.is_empty()).prop_map(|sql| json!({"sql": sql})),
        1 => key_ref().prop_map(|r| json!({"configMapRef": r})),
    ]
    .boxed()
}

fn pod_metadata() -> BoxedStrategy<Value> {
    let map = proptest::collection::btree_map(
        text("[a-z]{1,8}(\\.io/[a-z]{1,8})?"),
        text("[a-z0-9]{0,10}"),
        0..3,
    );
    prop_oneof![
        Just(Value::Null),
        (map.clone(), map).prop_map(|(l, a)| json!({"labels": l, "annotations": a}))
    ]
    .boxed()
}

/// A maintenance window, or none: its time zone and duration may be ones only the operator can
/// judge (an unknown zone, too short, too long); with `valid` false, its start too.
fn maintenance_window(valid: bool) -> BoxedStrategy<Value> {
    let days = proptest::sample::subsequence(
        vec![
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
            "Sunday",
        ],
        0..=7,
    );
    let start = if valid {
        text("([01][0-9]|2[0-3]):[0-5][0-9]")
    } else {
        text("[0-9:a-z ]{0,6}")
    };
    let duration = text("[0-9]{1,3}[smhdw]");
    let zone = maybe(listed(&[
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Australia/Lord_Howe",
        "Asia/Kathmandu",
        "Mars/Olympus",
    ]));
    prop_oneof![
        1 => Just(Value::Null),
        2 => (days, start, duration, zone).prop_map(|(days, start, duration, zone)| {
            object(vec![
                ("days", json!(days)),
                ("start", Value::String(start)),
                ("duration", Value::String(duration)),
                ("timeZone", zone),
            ])
        }),
    ]
    .boxed()
}

/// A Database spec as JSON: every field as the schema admits it (`valid`), or some not.
fn spec_json(valid: bool) -> BoxedStrategy<Value> {
    (
        (field(valid, version), maybe(text("[a-z0-9./:-]{1,40}"))),
        (field(valid, size), maybe(k8s_name())),
        maybe(k8s_name()),
        init(),
        listed(&["Retain", "Delete"]),
        pod_metadata(),
        prop_oneof![1 => Just(Value::Null), 3 => backup(valid)],
        (maintenance_window(valid), auto_grow(valid)),
    )
        .prop_map(
            |(
                (version, image),
                (size, class),
                creds,
                init,
                policy,
                pod_meta,
                backup,
                (window, auto_grow),
            )| {
                object(vec![
                    ("version", Value::String(version)),
                    ("image", image),
                    (
                        "storage",
                        object(vec![
                            ("size", Value::String(size)),
                            ("storageClassName", class),
                            ("autoGrow", auto_grow),
                        ]),
                    ),
                    (
                        "credentials",
                        if creds.is_null() {
                            creds
                        } else {
                            json!({ "secretName": creds })
                        },
                    ),
                    ("init", init),
                    ("deletionPolicy", Value::String(policy)),
                    ("podMetadata", pod_meta),
                    ("backup", backup),
                    ("maintenanceWindow", window),
                ])
            },
        )
        .boxed()
}

/// `storage.autoGrow`: absent, or a threshold, an increment (a quantity or a percentage) and a
/// maximum.
fn auto_grow(valid: bool) -> BoxedStrategy<Value> {
    let increment = prop_oneof![field(valid, size), text("[1-9][0-9]?%")];
    let threshold = match valid {
        true => (50u32..=95).boxed(),
        false => (0u32..300).boxed(),
    };
    prop_oneof![
        1 => Just(Value::Null),
        2 => (threshold, increment, field(valid, size)).prop_map(|(t, i, m)| {
            json!({"thresholdPercent": t, "increment": i, "maximum": m})
        }),
    ]
    .boxed()
}

fn time() -> BoxedStrategy<DateTime<Utc>> {
    // 1970 to 2096.
    (0i64..4_000_000_000)
        .prop_map(|s| Utc.timestamp_opt(s, 0).unwrap())
        .boxed()
}

fn status(version: String) -> BoxedStrategy<Option<DatabaseStatus>> {
    let backup = prop_oneof![
        Just(None),
        (proptest::option::of(time()), proptest::option::of(time())).prop_map(|(last, next)| {
            Some(BackupStatus {
                last_schedule_time: last,
                next_schedule_time: next,
                ..BackupStatus::default()
            })
        })
    ];
    prop_oneof![
        Just(None),
        (any::<bool>(), backup).prop_map(move |(run, backup)| {
            Some(DatabaseStatus {
                current_version: run.then(|| version.clone()),
                backup,
                ..DatabaseStatus::default()
            })
        })
    ]
    .boxed()
}

/// A Database as the API server would hand it over: its spec, a name, a uid, some status.
fn database(valid: bool) -> BoxedStrategy<Database> {
    (spec_json(valid), database_name())
        .prop_filter_map("the spec deserialises", |(spec, name)| {
            let spec: DatabaseSpec = serde_json::from_value(spec).ok()?;
            Some((spec, name))
        })
        .prop_flat_map(|(spec, name)| {
            let version = spec.version.clone();
            status(version).prop_map(move |status| {
                let mut db = Database::new(&name, spec.clone());
                db.metadata.namespace = Some("shop".into());
                db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
                db.metadata.generation = Some(1);
                db.status = status;
                db
            })
        })
        .boxed()
}

fn job_state() -> BoxedStrategy<JobState> {
    prop_oneof![
        Just(JobState::Running),
        Just(JobState::Succeeded),
        (text("[A-Za-z]{0,20}"), any::<String>())
            .prop_map(|(reason, detail)| JobState::Failed { reason, detail }),
    ]
    .boxed()
}

/// One of a few digests, so that a Job's and the spec's often agree.
fn sql_digest() -> BoxedStrategy<String> {
    prop_oneof![Just("aaaa".to_string()), Just("bbbb".to_string())].boxed()
}

fn init_job_fact() -> BoxedStrategy<InitJobFact> {
    (
        job_state(),
        proptest::option::of(sql_digest()),
        proptest::option::of(0i64..4),
        proptest::option::of(text("[a-z-]{1,30}")),
    )
        .prop_map(|(state, sql_digest, generation, config_map)| InitJobFact {
            state,
            uid: "uid".into(),
            sql_digest,
            generation,
            config_map,
        })
        .boxed()
}

fn credentials_fact() -> BoxedStrategy<CredentialsFact> {
    prop_oneof![
        Just(CredentialsFact::Usable),
        Just(CredentialsFact::GeneratedMissing),
        Just(CredentialsFact::GeneratedOrphaned),
        Just(CredentialsFact::UserSecretProblem(SecretProblem::NotFound)),
        Just(CredentialsFact::UserSecretProblem(
            SecretProblem::MissingPassword
        )),
    ]
    .boxed()
}

fn s3_problem() -> BoxedStrategy<Option<S3SecretProblem>> {
    prop_oneof![
        3 => Just(None),
        1 => k8s_name().prop_map(|secret| Some(S3SecretProblem::NotFound {
            secret,
            access_key_id_key: "AWS_ACCESS_KEY_ID".into(),
            secret_access_key_key: "AWS_SECRET_ACCESS_KEY".into(),
        })),
        1 => k8s_name().prop_map(|secret| Some(S3SecretProblem::MissingKeys {
            secret,
            keys: vec!["AWS_SECRET_ACCESS_KEY".into()],
            field: "secretAccessKeyKey",
        })),
    ]
    .boxed()
}

fn backup_record() -> BoxedStrategy<BackupRecord> {
    (
        text("[a-z]{1,10}-[0-9]{12}"),
        proptest::option::of(select(BackupPhase::ALL.to_vec())),
        time(),
        proptest::option::of(time()),
    )
        .prop_map(|(name, phase, created, completed)| BackupRecord {
            name,
            phase,
            created,
            completed,
            message: None,
        })
        .boxed()
}

/// What observe could have found, built the way decide's table tests build it.
/// Any claims, volume readings (a filesystem of any size, any free figure, also above its
/// size) and servers stopped on a full volume.
fn storage_fact() -> BoxedStrategy<StorageFact> {
    let bytes = || prop_oneof![Just(0u64), 0u64..(1 << 40), any::<u64>()];
    let usage = (bytes(), bytes()).prop_map(|(size_bytes, free_bytes)| VolumeUsage {
        size_bytes,
        free_bytes,
    });
    let claim = (proptest::option::of(bytes()), proptest::option::of(bytes())).prop_map(
        |(requested, capacity)| ClaimSize {
            name: "data-orders-0".into(),
            requested: requested.map(u128::from),
            capacity: capacity.map(u128::from),
        },
    );
    let pods = || proptest::collection::btree_map(text("orders-[0-3]"), usage.clone(), 0..3);
    let class = prop_oneof![
        Just(ClassFact::Unknown),
        Just(ClassFact::Expands),
        any::<bool>().prop_map(|missing| ClassFact::CannotExpand {
            name: "standard".into(),
            missing
        }),
    ];
    (
        proptest::collection::vec(claim, 0..3),
        pods(),
        pods(),
        class,
    )
        .prop_map(|(claims, usage, stopped_full, class)| StorageFact {
            claims,
            usage,
            stopped_full,
            class,
        })
        .boxed()
}

fn facts() -> BoxedStrategy<Facts> {
    let statefulset = proptest::option::of(
        (
            0..=1i32,
            any::<bool>(),
            any::<bool>(),
            text("[a-z0-9./:-]{1,40}"),
        )
            .prop_map(|(ready, rolled_out, current, image)| StatefulSetFact {
                replicas: 1,
                ready_replicas: ready,
                updated_replicas: i32::from(rolled_out),
                observed_current: current,
                rolled_out,
                template_rolling: !rolled_out,
                image: Some(image),
            }),
    );
    let volume = proptest::option::of(
        (any::<bool>(), any::<bool>(), size(true), size(false)).prop_map(
            |(bound, predates, requested, capacity)| VolumeFact {
                bound,
                predates_database: predates,
                requested: Some(requested),
                capacity: Some(capacity),
            },
        ),
    );
    let init_source = prop_oneof![
        Just(InitSourceFact::Available),
        k8s_name().prop_map(|name| InitSourceFact::ConfigMapNotFound { name }),
        (k8s_name(), k8s_name()).prop_map(|(name, key)| InitSourceFact::KeyNotFound { name, key }),
    ];
    let backups = (
        time(),
        proptest::collection::vec(backup_record(), 0..4),
        s3_problem(),
    )
        .prop_map(|(now, records, s3_problem)| BackupHistory {
            now,
            records,
            s3_problem,
        });
    (
        credentials_fact(),
        init_source,
        statefulset,
        volume,
        proptest::option::of(init_job_fact()),
        backups,
        storage_fact(),
        proptest::option::of(sql_digest()),
    )
        .prop_map(
            |(
                credentials,
                init_source,
                statefulset,
                volume,
                init_job,
                backups,
                storage,
                init_sql,
            )| Facts {
                credentials,
                archiver: None,
                init_source,
                statefulset,
                volume,
                storage,
                init_job,
                init_sql,
                backups,
                bootstrap: None,
                upgrade: Default::default(),
                instance_failure: None,
                unschedulable: None,
                restart: Default::default(),
                template: None,
                stuck_pods: vec![],
                tls: Default::default(),
                roles: Default::default(),
                release: Default::default(),
                accounts: Default::default(),
            },
        )
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Checks.

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// The name is a DNS label and dbop's own labels have valid values.
fn check_meta(kind: &str, meta: &ObjectMeta) -> Result<(), TestCaseError> {
    if let Some(name) = &meta.name {
        prop_assert!(is_dns_label(name), "{kind} name {name:?} is no DNS label");
    }
    for (key, value) in meta.labels.iter().flatten() {
        if key.starts_with("app.kubernetes.io/") || key.starts_with("dbop.dev/") {
            prop_assert!(is_label_value(value), "{kind} label {key}={value:?}");
        }
    }
    Ok(())
}

/// Every condition of a decision speaks: a reason and a sentence; a blocked one names its field.
fn check_decision(db: &Database, d: &Decision) -> Result<(), TestCaseError> {
    for c in &d.conditions {
        prop_assert!(!c.reason.is_empty(), "{:?} without a reason", c.type_);
        prop_assert!(
            !c.message.trim().is_empty(),
            "{:?} without a message",
            c.type_
        );
    }
    let ready = d
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready);
    if matches!(d.phase, Phase::Failed | Phase::Pending) {
        prop_assert!(
            ready.is_some_and(|c| !c.status),
            "{:?} without Ready=False",
            d.phase
        );
    }
    if check_version(&db.spec.version).is_err() {
        prop_assert_eq!(d.phase, Phase::Failed);
        let message = &ready.expect("Ready").message;
        prop_assert!(message.contains("version"), "{message}");
    }
    if let Some(spec) = &db.spec.backup
        && let (Err(problem), Some(plan)) = (BackupSettings::parse(spec), &d.backup)
    {
        prop_assert!(problem.contains("spec.backup."), "{problem}");
        let message = plan.condition.as_ref().map(|c| c.message.clone());
        prop_assert_eq!(message.as_ref(), Some(&problem));
        prop_assert!(plan.create.is_none(), "a run planned from an invalid spec");
    }
    if let Some(plan) = &d.backup {
        if let Some(new) = &plan.create {
            prop_assert!(is_dns_label(&new.name), "backup name {:?}", new.name);
        }
        for e in &plan.events {
            prop_assert!(!e.reason.is_empty() && !e.note.is_empty(), "{e:?}");
        }
    }
    Ok(())
}

const PASSWORD_MARK: &str = "pw-0f3a9c";

/// What act would build for a Database that may proceed: names, labels, and no password.
fn check_builders(db: &Database, d: &Decision, password: &str) -> Result<(), TestCaseError> {
    let settings = Settings::default();
    let sts = statefulset::statefulset(db, &settings, None);
    let headless = services::headless(db);
    let rw = services::read_write(db);
    check_meta("StatefulSet", &sts.metadata)?;
    check_meta("Service", &headless.metadata)?;
    check_meta("Service", &rw.metadata)?;
    if let Some(template) = sts.spec.template.metadata.as_ref() {
        check_meta("pod template", template)?;
    }
    let mut built = vec![
        serde_json::to_string(&sts).unwrap(),
        serde_json::to_string(&headless).unwrap(),
        serde_json::to_string(&rw).unwrap(),
    ];
    if let Some(job) = init_job(db, &settings, None) {
        check_meta("init Job", &job.metadata)?;
        built.push(serde_json::to_string(&job).unwrap());
    }
    if let Some(cm) = init_sql_config_map(db) {
        check_meta("ConfigMap", &cm.metadata)?;
        built.push(serde_json::to_string(&cm).unwrap());
    }
    if let Some(job) = scheduled_backup_job(db, d)? {
        built.push(job);
    }
    for object in &built {
        prop_assert!(!object.contains(password), "password in {object}");
    }
    let secret = generated_secret(db, password);
    check_meta("Secret", &secret.metadata)?;
    let stored = &secret.data.as_ref().expect("data")["password"].0;
    prop_assert_eq!(stored.as_slice(), password.as_bytes());
    Ok(())
}

/// The Job of the scheduled backup the plan creates (or would at the next run), serialised.
fn scheduled_backup_job(db: &Database, d: &Decision) -> Result<Option<String>, TestCaseError> {
    let Some(spec) = &db.spec.backup else {
        return Ok(None);
    };
    let at = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let name = d
        .backup
        .as_ref()
        .and_then(|p| p.create.as_ref())
        .map_or_else(|| scheduled_backup_name(&db.name(), at), |n| n.name.clone());
    let mut b = DatabaseBackup::new(
        &name,
        DatabaseBackupSpec {
            database: db.name(),
            reason: Default::default(),
            method: dbop::api::BackupMethod::Logical,
        },
    );
    b.metadata.namespace = Some("shop".into());
    b.metadata.uid = Some("1b5e6f0a-1111-2222-3333-444455556666".into());
    match backup_job(db, &b, at, &Settings::default()) {
        Ok(job) => {
            check_meta("backup Job", &job.metadata)?;
            Ok(Some(serde_json::to_string(&job).unwrap()))
        }
        Err(problem) => {
            let parses = BackupSettings::parse(spec).is_ok();
            let has_run = db.status.as_ref().and_then(|s| s.current_version.as_ref());
            prop_assert!(!parses || has_run.is_none(), "{problem:?}");
            Ok(None)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties.

#[test]
fn database_specs_through_decide_and_the_builders() {
    let strategy = (
        prop_oneof![1 => database(true), 1 => database(false)],
        facts(),
        text("[A-Za-z0-9]{24}"),
    );
    let (built, blocked, bad_backup) = (Cell::new(0), Cell::new(0), Cell::new(0));
    check(
        "Database: decide + builders",
        6000,
        strategy,
        |(db, facts, pw)| {
            let password = format!("{PASSWORD_MARK}{pw}");
            let d = decide(&db, &facts, &Settings::default());
            check_decision(&db, &d)?;
            let invalid_backup = db.spec.backup.as_deref().map(BackupSettings::parse);
            bad_backup.set(bad_backup.get() + u32::from(matches!(invalid_backup, Some(Err(_)))));
            if d.steps.apply_statefulset {
                built.set(built.get() + 1);
                check_builders(&db, &d, &password)?;
            } else {
                blocked.set(blocked.get() + 1);
            }
            Ok(())
        },
    );
    println!(
        "  of which {} reached the builders, {} were blocked, {} had an invalid spec.backup",
        built.get(),
        blocked.get(),
        bad_backup.get()
    );
    // The generators must reach both sides, or the property says little.
    assert!(built.get() > 1000 && blocked.get() > 500 && bad_backup.get() > 300);
}

#[test]
fn backup_specs_parse_or_name_the_field() {
    let (parsed, refused) = (Cell::new(0), Cell::new(0));
    check(
        "spec.backup: BackupSettings::parse",
        3000,
        backup(false),
        |json| {
            let Ok(spec) = serde_json::from_value(json) else {
                return Ok(());
            };
            match BackupSettings::parse(&spec) {
                Ok(_) => parsed.set(parsed.get() + 1),
                Err(message) => {
                    refused.set(refused.get() + 1);
                    prop_assert!(message.starts_with("spec.backup."), "{message}");
                }
            }
            Ok(())
        },
    );
    println!(
        "  of which {} parsed, {} refused",
        parsed.get(),
        refused.get()
    );
    assert!(parsed.get() > 300 && refused.get() > 300);
}

/// Replaces one field of a valid spec by a value of the wrong type.
fn wrong_type() -> BoxedStrategy<(Vec<&'static str>, Value)> {
    let path = select(vec![
        vec!["version"],
        vec!["storage"],
        vec!["storage", "size"],
        vec!["replicas"],
        vec!["init"],
        vec!["deletionPolicy"],
        vec!["backup", "schedule"],
        vec!["backup", "s3"],
        vec!["backup", "s3", "bucket"],
        vec!["backup", "retention", "keepLast"],
        vec!["backup", "suspend"],
    ]);
    let value = select(vec![
        json!(42),
        json!(-1),
        json!(null),
        json!([]),
        json!({}),
        json!("x"),
        json!(true),
        json!(1e300),
    ]);
    (path, value).boxed()
}

#[test]
fn wrongly_typed_specs_are_refused_with_a_message() {
    let strategy = (spec_json(true), wrong_type());
    check(
        "Database: wrongly typed JSON",
        1000,
        strategy,
        |(mut spec, (path, value))| {
            let mut at = &mut spec;
            for key in &path[..path.len() - 1] {
                match at.get_mut(*key) {
                    Some(next) => at = next,
                    None => return Ok(()),
                }
            }
            at[path[path.len() - 1]] = value;
            if let Err(e) = serde_json::from_value::<DatabaseSpec>(spec) {
                prop_assert!(!e.to_string().is_empty());
            }
            Ok(())
        },
    );
}

fn termination_message() -> BoxedStrategy<Option<String>> {
    let result = (
        select(vec!["Succeeded", "Failed", "Bogus"]),
        proptest::option::of(any::<String>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(outcome, message, size)| {
            json!({"outcome": outcome, "message": message, "sizeBytes": size}).to_string()
        });
    prop_oneof![
        Just(None),
        result.prop_map(Some),
        any::<String>().prop_map(Some),
        (
            any::<String>(),
            text("\\{\"outcome\":\"(Failed|Succeeded)\"\\}")
        )
            .prop_map(|(log, line)| Some(format!("{log}\n{line}"))),
    ]
    .boxed()
}

fn backup_facts() -> BoxedStrategy<BackupFacts> {
    let database = proptest::option::of(
        (
            proptest::option::of(select(Phase::ALL.to_vec())),
            any::<bool>(),
            proptest::option::of(Just(
                "spec.backup.timeout \"x\" is not a positive duration".to_string(),
            )),
            any::<bool>(),
            s3_problem(),
            any::<bool>(),
        )
            .prop_map(
                |(phase, has_backup_spec, spec_problem, has_run, s3_problem, archives_wal)| {
                    DatabaseFacts {
                        phase,
                        has_backup_spec,
                        archives_wal,
                        spec_problem,
                        has_run,
                        s3_problem,
                    }
                },
            ),
    );
    let job = proptest::option::of(
        (
            job_state(),
            proptest::option::of(time()),
            proptest::option::of(time()),
            termination_message(),
        )
            .prop_map(
                |(state, start_time, completion_time, termination_message)| JobFacts {
                    state,
                    start_time,
                    completion_time,
                    termination_message,
                },
            ),
    );
    let ahead = proptest::collection::vec((k8s_name(), any::<bool>()), 0..3);
    (time(), database, ahead, job)
        .prop_map(|(now, database, ahead, job)| BackupFacts {
            now,
            database,
            ahead,
            job,
            stale_job: false,
        })
        .boxed()
}

fn database_backup() -> BoxedStrategy<DatabaseBackup> {
    let spec = (
        prop_oneof![database_name(), any::<String>()],
        select(vec!["Scheduled", "Manual", "PreUpgrade", "Final", "Weekly"]),
    );
    let name = text("[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?");
    let previous = proptest::option::of(select(BackupPhase::ALL.to_vec()));
    (spec, name, previous)
        .prop_filter_map(
            "the spec deserialises",
            |((database, reason), name, phase)| {
                let spec: DatabaseBackupSpec =
                    serde_json::from_value(json!({"database": database, "reason": reason})).ok()?;
                let mut b = DatabaseBackup::new(&name, spec);
                b.metadata.namespace = Some("shop".into());
                b.status = phase.map(|phase| DatabaseBackupStatus {
                    phase: Some(phase),
                    message: Some("as it was".into()),
                    ..DatabaseBackupStatus::default()
                });
                Some(b)
            },
        )
        .boxed()
}

#[test]
fn database_backups_through_decide() {
    let strategy = (database_backup(), backup_facts());
    check(
        "DatabaseBackup: decide + job name",
        3000,
        strategy,
        |(backup, facts)| {
            let d = decide_backup(&backup, &facts);
            let message = d.status.message.as_deref().unwrap_or_default();
            prop_assert!(d.status.phase.is_some(), "no phase: {d:?}");
            prop_assert!(!message.trim().is_empty(), "no message: {d:?}");
            if d.status.phase == Some(BackupPhase::Failed)
                && backup.status.is_none()
                && facts.job.is_none()
            {
                prop_assert!(message.contains("Database"), "{message}");
            }
            let name = job_name(backup.metadata.name.as_deref().unwrap_or_default());
            prop_assert!(
                name.len() <= 63 && is_label_value(&name),
                "Job name {name:?}"
            );
            Ok(())
        },
    );
}
