//! Planning rounds with lookups (WIT `lookup` steps): a planner that must read its backend
//! before it can plan (a volume's recorded size, whether a directory exists, the space left)
//! names the reads in its answer; the host checks them with the policy like any step, makes
//! them, and calls the planner again with the answers in the request's `looked-up`, until the
//! answer names no lookup left unanswered. The plan that comes out never holds a lookup: the
//! executor never sees one.
//!
//! At most [`MAX_ROUNDS`] calls: a planner that keeps asking for new reads is refused. Reads
//! are `GET` or `HEAD` on hosts the policy granted (the same rules as `http` steps), their
//! bodies cut at [`crate::unpriv::http::MAX_READ`]; a URL that does not answer gives status 0,
//! which the planner reads as it sees fit (its backend is down).

use std::collections::BTreeMap;

use crate::error::Error;
use crate::plan::{Plan, Step, resolve};
use crate::plugin::bindings::types as wit;
use crate::secrets::Secrets;
use crate::unpriv::http::HttpClient;

/// The most planner calls one planning may take (the first and three with answers).
pub const MAX_ROUNDS: usize = 4;

/// The answers of one planning so far. A caller loops: it calls the planner with
/// [`Rounds::looked_up`], checks the answer with the policy, and asks [`Rounds::settle`],
/// which makes the lookups the checked plan names that have no answer yet (then the caller calls
/// again) or, when none is left, strips the lookups from the plan (then it is final).
#[derive(Debug, Default)]
pub struct Rounds {
    answers: BTreeMap<String, wit::LookedUp>,
    calls: usize,
}

impl Rounds {
    /// The answers so far, for the next planner call's `looked-up`.
    pub fn looked_up(&self) -> Vec<wit::LookedUp> {
        self.answers.values().cloned().collect()
    }

    /// After a planner call whose checked answer is `plan`: `true` when it names no lookup
    /// without an answer (its lookups are removed: `plan` is final), `false` once those lookups
    /// are made (call the planner again). An error past [`MAX_ROUNDS`] calls.
    pub async fn settle(
        &mut self,
        http: &HttpClient,
        secrets: &Secrets,
        plugin: &str,
        plan: &mut Plan,
    ) -> Result<bool, Error> {
        self.calls += 1;
        let pending: Vec<Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Lookup { key, .. } if !self.answers.contains_key(key)))
            .cloned()
            .collect();
        if pending.is_empty() {
            plan.steps.retain(|s| !matches!(s, Step::Lookup { .. }));
            return Ok(true);
        }
        if self.calls >= MAX_ROUNDS {
            return Err(Error::internal(format!(
                "plugin {plugin} still asked for lookups after {MAX_ROUNDS} rounds of planning (a plugin bug)"
            )));
        }
        for step in pending {
            let Step::Lookup { key, method, urls, headers } = step else { continue };
            let headers: Vec<(String, String)> =
                headers.iter().map(|h| (h.name.clone(), resolve(&h.value, secrets))).collect();
            let read = http
                .read(&method, &urls, &headers)
                .await
                .map_err(|e| Error::internal(secrets.scrub(&format!("plugin {plugin}'s lookup {key:?}: {e}"))))?;
            tracing::debug!(plugin, key = %key, status = read.status, bytes = read.body.len(), "looked up");
            let answer =
                wit::LookedUp { key: key.clone(), status: read.status, body: read.body, truncated: read.truncated };
            self.answers.insert(key, answer);
        }
        Ok(false)
    }
}

/// Wrap non-plan steps (a provision, expand, capacity, list or describe answer's) for the
/// policy, which judges plans.
pub fn as_plan(steps: Vec<wit::Step>) -> wit::Plan {
    wit::Plan { steps, attributes: Vec::new() }
}
