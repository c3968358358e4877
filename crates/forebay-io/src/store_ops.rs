//! Operations on an object store that forebay's directories build from object_store's own:
//! a copy that is done if it was done before, a bulk delete retried as object_store does not
//! retry it, and the object path of a directory-relative path. A remote `Dir` (`dir.rs`) uses them
//! for its remote side.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

/// Copy `src` to `dst` server-side (the object appears whole). Idempotent: a source
/// already gone is fine when the destination is there (copied and deleted before).
pub(crate) async fn copy_object(
    store: &dyn ObjectStore,
    src: &ObjectPath,
    dst: &ObjectPath,
) -> object_store::Result<()> {
    match store.copy(src, dst).await {
        Ok(()) => Ok(()),
        Err(object_store::Error::NotFound { .. }) => store.head(dst).await.map(drop),
        Err(e) => Err(e),
    }
}

/// Delete every object of `locations` in as few requests as the store allows (S3: up to
/// 1,000 a request); objects already gone are fine.
///
/// object_store retries a request whose connection failed before it was sent, but not a bulk
/// delete (a POST) whose connection broke after: it cannot know the request is idempotent.
/// Deleting again is harmless, so a failed attempt is retried (3 times, from 100 ms apart)
/// unless the store refused the credentials.
pub(crate) async fn delete_all(
    store: &dyn ObjectStore,
    locations: Vec<ObjectPath>,
) -> object_store::Result<()> {
    let attempt = || async {
        let listed = futures::stream::iter(locations.clone().into_iter().map(Ok)).boxed();
        let mut deleted = store.delete_stream(listed);
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_times(3);
    attempt
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| {
            !matches!(
                e,
                object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }
            )
        })
        .await
}

pub(crate) fn object_path(prefix: &ObjectPath, relative: &str) -> ObjectPath {
    relative
        .split('/')
        .filter(|p| !p.is_empty())
        .fold(prefix.clone(), |p, part| p.clone().join(part))
}
