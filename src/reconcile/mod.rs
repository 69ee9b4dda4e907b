//! One reconcile of a Database: observe → decide → act.
//!
//! - `observe` reads the Database's owned objects (the only reads) and reduces them to `Facts`;
//! - `decide` is a pure function of the Database, the facts and `now`: the phase, the
//!   conditions and the steps to take — all the domain knowledge lives there;
//! - `act` builds the desired objects, writes only what drifted, patches status only when it
//!   changed, and emits Events on transitions;
//! - `cleanup` is the finalizer's deletion policy.

pub mod act;
pub mod cleanup;
pub mod decide;
pub mod drift;
pub mod events;
pub mod observe;
pub mod quantity;
