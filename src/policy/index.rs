//! Which rules an event can match, found without trying every rule: a
//! policy of a thousand tenants, each with its rule, would otherwise try a
//! thousand conditions per event before its default.
//!
//! Exact by construction: a rule with a tenant condition can only match an
//! event of one of the tenants it names, so it is listed under each of
//! them; the rules without one are listed for every event. An event is then
//! tried against its tenant's rules and those, merged in rule order, and
//! the first whose whole condition matches decides, as a scan of every rule
//! would.

use std::collections::HashMap;

use super::{Field, Rule};

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct TenantIndex {
    /// Each tenant a rule names, and those rules, in rule order.
    by_tenant: HashMap<String, Vec<usize>>,
    /// The rules without a tenant condition, in rule order.
    any_tenant: Vec<usize>,
}

impl TenantIndex {
    pub(super) fn of(rules: &[Rule]) -> TenantIndex {
        let mut index = TenantIndex::default();
        for (i, rule) in rules.iter().enumerate() {
            let tenants = (rule.when.fields.iter()).find(|(field, _)| *field == Field::Tenant);
            match tenants {
                Some((_, values)) => {
                    for tenant in values {
                        let listed = index.by_tenant.entry(tenant.clone()).or_default();
                        if listed.last() != Some(&i) {
                            listed.push(i);
                        }
                    }
                }
                None => index.any_tenant.push(i),
            }
        }
        index
    }

    /// The rules an event of `tenant` may match, in rule order.
    pub(super) fn candidates(&self, tenant: Option<&str>) -> Merged<'_> {
        let named = tenant
            .and_then(|t| self.by_tenant.get(t))
            .map_or(&[][..], Vec::as_slice);
        Merged {
            a: named,
            b: &self.any_tenant,
        }
    }
}

/// Two ascending lists of rule positions, merged.
pub(super) struct Merged<'a> {
    a: &'a [usize],
    b: &'a [usize],
}

impl Iterator for Merged<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let take_a = match (self.a.first(), self.b.first()) {
            (Some(a), Some(b)) => a < b,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        let (head, rest) = if take_a {
            self.a.split_first()?
        } else {
            self.b.split_first()?
        };
        if take_a {
            self.a = rest;
        } else {
            self.b = rest;
        }
        Some(*head)
    }
}
