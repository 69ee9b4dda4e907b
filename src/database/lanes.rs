//! Repairs first: the two lanes a Database pass waits in before it runs. A Database that is
//! Ready or Degraded at its current generation was converged once, so a pass for it is a repair
//! (an owned object deleted or edited, a primary lost) or finds nothing to do; it takes the
//! repair lane. Every other pass (a new Database, a changed spec, a deletion) takes the
//! convergence lane. Convergence holds `concurrency` permits; repairs hold a reserve of their
//! own and may also take a free convergence permit, so a thousand converging Databases never
//! queue a repair behind them.

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::api::{Database, Phase};

/// Where a pass waits for its permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Repair,
    Convergence,
}

/// The lane of a pass for `db`: repair for a Database converged at its current generation.
pub fn lane_of(db: &Database) -> Lane {
    let status = db.status.as_ref();
    let converged = matches!(
        status.and_then(|s| s.phase),
        Some(Phase::Ready | Phase::Degraded)
    );
    let current = status.and_then(|s| s.observed_generation) == db.metadata.generation;
    let deleting = db.metadata.deletion_timestamp.is_some();
    if converged && current && !deleting {
        Lane::Repair
    } else {
        Lane::Convergence
    }
}

/// The repair lane's reserve for `concurrency` convergence permits: a quarter, at least one.
pub fn repair_reserve(concurrency: usize) -> usize {
    concurrency.div_ceil(4).max(1)
}

/// The permits of both lanes.
pub struct Lanes {
    convergence: Semaphore,
    repair: Semaphore,
}

impl Lanes {
    /// `concurrency` convergence permits (0: unbounded) and the repair lane's reserve.
    pub fn new(concurrency: u16) -> Self {
        let convergence = match usize::from(concurrency) {
            0 => Semaphore::MAX_PERMITS,
            n => n,
        };
        Self {
            convergence: Semaphore::new(convergence),
            repair: Semaphore::new(repair_reserve(convergence.min(1 << 16))),
        }
    }

    /// Waits for a permit of `lane`; the pass runs while it is held. A repair takes whichever
    /// is free first, its reserve or a convergence permit.
    pub async fn enter(&self, lane: Lane) -> SemaphorePermit<'_> {
        let permit = match lane {
            Lane::Convergence => self.convergence.acquire().await,
            Lane::Repair => tokio::select! {
                biased;
                permit = self.repair.acquire() => permit,
                permit = self.convergence.acquire() => permit,
            },
        };
        // Neither semaphore is ever closed.
        permit.unwrap_or_else(|_| unreachable!("the lanes' semaphores are never closed"))
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::api::DatabaseStatus;

    fn db(phase: Option<Phase>, generation: i64, observed: Option<i64>) -> Database {
        let mut db = crate::resources::testing::minimal();
        db.metadata.generation = Some(generation);
        db.status = Some(DatabaseStatus {
            phase,
            observed_generation: observed,
            ..DatabaseStatus::default()
        });
        db
    }

    #[test]
    fn a_converged_database_at_its_generation_is_a_repair() {
        assert_eq!(lane_of(&db(Some(Phase::Ready), 3, Some(3))), Lane::Repair);
        assert_eq!(
            lane_of(&db(Some(Phase::Degraded), 3, Some(3))),
            Lane::Repair
        );
    }

    #[test]
    fn new_changed_failed_or_deleted_databases_converge() {
        assert_eq!(lane_of(&db(None, 1, None)), Lane::Convergence);
        assert_eq!(
            lane_of(&db(Some(Phase::Provisioning), 1, Some(1))),
            Lane::Convergence
        );
        assert_eq!(
            lane_of(&db(Some(Phase::Ready), 4, Some(3))),
            Lane::Convergence
        );
        assert_eq!(
            lane_of(&db(Some(Phase::Failed), 1, Some(1))),
            Lane::Convergence
        );
        let mut deleted = db(Some(Phase::Ready), 1, Some(1));
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(lane_of(&deleted), Lane::Convergence);
    }

    #[test]
    fn the_reserve_is_a_quarter_and_at_least_one() {
        assert_eq!(repair_reserve(16), 4);
        assert_eq!(repair_reserve(5), 2);
        assert_eq!(repair_reserve(1), 1);
    }

    #[tokio::test]
    async fn a_repair_runs_while_convergence_is_full() {
        let lanes = Lanes::new(2);
        let _busy = (
            lanes.enter(Lane::Convergence).await,
            lanes.enter(Lane::Convergence).await,
        );
        let third = lanes.enter(Lane::Convergence).now_or_never();
        assert!(third.is_none(), "a third convergence pass waits");
        let repair = lanes.enter(Lane::Repair).now_or_never();
        assert!(repair.is_some(), "a repair takes the reserve at once");
    }

    #[tokio::test]
    async fn a_repair_takes_a_free_convergence_permit_once_its_reserve_is_busy() {
        let lanes = Lanes::new(4);
        let _reserve = lanes.enter(Lane::Repair).await;
        assert_eq!(lanes.repair.available_permits(), 0);
        let second = lanes.enter(Lane::Repair).now_or_never();
        assert!(second.is_some());
        assert_eq!(lanes.convergence.available_permits(), 3);
    }
}
