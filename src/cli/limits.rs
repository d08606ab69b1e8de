//! `blobgate limits`: limits on principals, stored in the metadata database and applied by every running server
//! at its next request (src/throttle.rs says what each limit allows and which cover a request).

use anyhow::bail;

use super::LimitsCommand;
use crate::names::BucketName;
use crate::store::{Store, unix_now};
use crate::throttle::{LimitSet, Subject, show_size};

pub async fn limits(store: &Store, command: LimitsCommand) -> anyhow::Result<()> {
    match command {
        LimitsCommand::Set { principal, limits } => {
            let subject = Subject::parse(&principal)?;
            require_principal(store, &subject).await?;
            let change = limits.into_set();
            let set = match store.meta.set_limit(&subject, &change, unix_now()).await? {
                Ok(set) => set,
                Err(refused) => bail!("{refused}"),
            };
            println!("{}", line(&subject, &set));
        }
        LimitsCommand::Show { principal } => {
            let only = principal.as_deref().map(Subject::parse).transpose()?;
            let mut shown = 0;
            for (subject, set) in store.meta.limits().await? {
                if only.as_ref().is_none_or(|only| *only == subject) {
                    println!("{}", line(&subject, &set));
                    shown += 1;
                }
            }
            if let (Some(only), 0) = (only, shown) {
                bail!("no limit on {only}");
            }
        }
        LimitsCommand::Clear { principal } => {
            let subject = Subject::parse(&principal)?;
            if !store.meta.clear_limit(&subject).await? {
                bail!("no limit on {subject}");
            }
            eprintln!("cleared the limit on {subject}");
        }
    }
    Ok(())
}

/// A limit as `limits show` prints it: one JSON line, each value as `limits set` takes it.
pub fn line(subject: &Subject, set: &LimitSet) -> serde_json::Value {
    serde_json::json!({
        "principal": subject.to_string(),
        "requests": set.requests.map(|r| r.to_string()),
        "request_burst": set.request_burst(),
        "read": set.read_bytes.map(|r| format!("{}/s", show_size(r))),
        "read_burst": set.read_burst().map(show_size),
        "write": set.write_bytes.map(|r| format!("{}/s", show_size(r))),
        "write_burst": set.write_burst().map(show_size),
        "concurrent": set.concurrent,
        "weight": set.weight.unwrap_or(1),
        "ipv4_prefix": (*subject == Subject::Anonymous).then(|| set.prefixes().0),
        "ipv6_prefix": (*subject == Subject::Anonymous).then(|| set.prefixes().1),
        "summary": set.describe(),
    })
}

/// A token, S3 key or bucket named must exist: a typo must not set a limit on no one.
async fn require_principal(store: &Store, subject: &Subject) -> anyhow::Result<()> {
    let exists = match subject {
        Subject::Default | Subject::Anonymous => true,
        Subject::Token(id) => store.meta.token(id).await?.is_some(),
        Subject::S3Key(id) => store.meta.s3_key(id).await?.is_some(),
        Subject::Bucket(name) => store.meta.bucket(&BucketName::parse(name)?).await?.is_some(),
    };
    if !exists {
        bail!("no {} {:?}: limits are set on existing principals", subject.scope(), subject.name());
    }
    Ok(())
}
