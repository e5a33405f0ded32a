//! A small boolean optimisation model: variables, labelled hard constraints, weighted costs.
//!
//! The layout problem is written once in this form ([`super::solve`]); it is then handed to Z3,
//! or — if Z3 gives up — to a deterministic DPLL search that finds a feasible assignment by
//! trying each group's preferred option first. [`Model::check`] verifies any assignment against
//! every hard constraint, and [`Model::cost`] prices it, so both paths are checked the same way.

/// A boolean variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub usize);

/// A variable or its negation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lit {
    /// The variable.
    pub var: Var,
    /// `true` for the variable itself, `false` for its negation.
    pub positive: bool,
}

impl Var {
    /// The positive literal.
    pub fn pos(self) -> Lit {
        Lit {
            var: self,
            positive: true,
        }
    }
    /// The negative literal.
    pub fn negative(self) -> Lit {
        Lit {
            var: self,
            positive: false,
        }
    }
}

impl Lit {
    /// The literal's value under `a`.
    pub fn eval(self, a: &[bool]) -> bool {
        a[self.var.0] == self.positive
    }
}

/// The shape of a hard constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConstraintKind {
    /// At least one literal holds.
    Clause(Vec<Lit>),
    /// Exactly one variable is true (an empty list is unsatisfiable).
    ExactlyOne(Vec<Var>),
    /// At most one variable is true.
    AtMostOne(Vec<Var>),
}

/// A hard constraint with the reason it exists (named in unsat reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    /// What must hold.
    pub kind: ConstraintKind,
    /// Who asked for it, e.g. `kernel op 3 (kn_matmul_op): innermost dim among the last two`.
    pub origin: String,
}

/// A cost paid when every literal of `when` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cost {
    /// Conjunction of literals.
    pub when: Vec<Lit>,
    /// Weight (≥ 0).
    pub weight: i64,
}

/// An exactly-one group with its options in order of preference (used by the fallback search).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Options, most preferred first.
    pub options: Vec<Var>,
}

/// The model.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Variable names.
    pub names: Vec<String>,
    /// Hard constraints.
    pub constraints: Vec<Constraint>,
    /// Costs to minimise.
    pub costs: Vec<Cost>,
    /// Decision groups for the fallback search.
    pub choices: Vec<Choice>,
}

impl Model {
    /// A new variable.
    pub fn var(&mut self, name: impl Into<String>) -> Var {
        self.names.push(name.into());
        Var(self.names.len() - 1)
    }

    /// Adds a hard constraint.
    pub fn require(&mut self, kind: ConstraintKind, origin: impl Into<String>) {
        self.constraints.push(Constraint {
            kind,
            origin: origin.into(),
        });
    }

    /// Adds a cost.
    pub fn cost(&mut self, when: Vec<Lit>, weight: i64) {
        if weight > 0 {
            self.costs.push(Cost { when, weight });
        }
    }

    /// The first constraint `a` violates.
    pub fn check(&self, a: &[bool]) -> Option<&Constraint> {
        self.constraints.iter().find(|c| !holds(&c.kind, a))
    }

    /// The total cost of `a`.
    pub fn total_cost(&self, a: &[bool]) -> i64 {
        self.costs
            .iter()
            .filter(|c| c.when.iter().all(|l| l.eval(a)))
            .map(|c| c.weight)
            .sum()
    }

    /// The search's decision order: the choice groups' variables (first option first, tried
    /// true first), then the rest (tried false first).
    fn decision_order(&self) -> Vec<(Var, bool)> {
        let mut order: Vec<(Var, bool)> = Vec::new();
        let mut seen = vec![false; self.names.len()];
        for c in &self.choices {
            for &v in &c.options {
                if !seen[v.0] {
                    seen[v.0] = true;
                    order.push((v, true));
                }
            }
        }
        for (i, s) in seen.iter().enumerate() {
            if !s {
                order.push((Var(i), false));
            }
        }
        order
    }

    /// A feasible assignment by depth-first search, trying each choice's options in order and
    /// every other variable false first; `None` if none exists within `max_steps` decisions.
    ///
    /// The search keeps its own stack (a graph of any size needs no deeper call stack) and,
    /// after each decision, re-checks only the constraints that mention the decided variable:
    /// the others cannot have changed. Each decision costs the size of those constraints, not
    /// of the whole model.
    pub fn search(&self, max_steps: usize) -> Option<Vec<bool>> {
        let n = self.names.len();
        let order = self.decision_order();
        // The constraints that mention each variable (once each).
        let mut mentions: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (ci, c) in self.constraints.iter().enumerate() {
            for v in c.kind.vars() {
                let list = &mut mentions[v.0];
                if list.last() != Some(&ci) {
                    list.push(ci);
                }
            }
        }
        let mut value: Vec<Option<bool>> = vec![None; n];
        // A constraint that no assignment can satisfy (an empty clause) fails every decision.
        let hopeless = self
            .constraints
            .iter()
            .any(|c| !partially_holds(&c.kind, &value));
        // tried[k]: how many values the variable decided at depth k has had (0, 1 or 2).
        let mut tried = vec![0u8; order.len()];
        let mut steps = 0usize;
        let mut k = 0usize;
        loop {
            if k == order.len() {
                return Some(value.into_iter().map(|v| v.unwrap_or(false)).collect());
            }
            let (v, first) = order[k];
            if tried[k] == 2 {
                // Both values failed below: undo and go back up.
                value[v.0] = None;
                tried[k] = 0;
                k = k.checked_sub(1)?;
                continue;
            }
            let b = if tried[k] == 0 { first } else { !first };
            tried[k] += 1;
            steps += 1;
            if steps > max_steps {
                return None;
            }
            value[v.0] = Some(b);
            let consistent = !hopeless
                && mentions[v.0]
                    .iter()
                    .all(|&ci| partially_holds(&self.constraints[ci].kind, &value));
            if consistent {
                k += 1;
            }
        }
    }
}

impl ConstraintKind {
    /// The variables the constraint mentions (with repeats, in order).
    fn vars(&self) -> Box<dyn Iterator<Item = Var> + '_> {
        match self {
            ConstraintKind::Clause(lits) => Box::new(lits.iter().map(|l| l.var)),
            ConstraintKind::ExactlyOne(vs) | ConstraintKind::AtMostOne(vs) => {
                Box::new(vs.iter().copied())
            }
        }
    }
}

/// Whether a constraint can still hold once the unassigned variables of `value` are decided.
fn partially_holds(kind: &ConstraintKind, value: &[Option<bool>]) -> bool {
    match kind {
        ConstraintKind::Clause(lits) => lits
            .iter()
            .any(|l| value[l.var.0].is_none_or(|b| b == l.positive)),
        ConstraintKind::ExactlyOne(vs) => {
            let trues = vs.iter().filter(|v| value[v.0] == Some(true)).count();
            let open = vs.iter().filter(|v| value[v.0].is_none()).count();
            trues <= 1 && trues + open >= 1
        }
        ConstraintKind::AtMostOne(vs) => {
            vs.iter().filter(|v| value[v.0] == Some(true)).count() <= 1
        }
    }
}

fn holds(kind: &ConstraintKind, a: &[bool]) -> bool {
    match kind {
        ConstraintKind::Clause(lits) => lits.iter().any(|l| l.eval(a)),
        ConstraintKind::ExactlyOne(vs) => vs.iter().filter(|v| a[v.0]).count() == 1,
        ConstraintKind::AtMostOne(vs) => vs.iter().filter(|v| a[v.0]).count() <= 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The recursive search the fallback used before it kept its own stack and checked only
    /// the constraints of the decided variable.
    fn recursive_search(m: &Model, max_steps: usize) -> Option<Vec<bool>> {
        fn dfs(
            m: &Model,
            order: &[(Var, bool)],
            k: usize,
            value: &mut Vec<Option<bool>>,
            steps: &mut usize,
            max: usize,
        ) -> bool {
            if k == order.len() {
                return true;
            }
            let (v, first) = order[k];
            for b in [first, !first] {
                *steps += 1;
                if *steps > max {
                    return false;
                }
                value[v.0] = Some(b);
                let consistent = m
                    .constraints
                    .iter()
                    .all(|c| partially_holds(&c.kind, value));
                if consistent && dfs(m, order, k + 1, value, steps, max) {
                    return true;
                }
            }
            value[v.0] = None;
            false
        }
        let n = m.names.len();
        let order = m.decision_order();
        let mut value = vec![None; n];
        let mut steps = 0;
        dfs(m, &order, 0, &mut value, &mut steps, max_steps)
            .then(|| value.into_iter().map(|v| v.unwrap_or(false)).collect())
    }

    /// A random model over `n` variables from a list of (kind, variables, polarity bits).
    fn model(n: usize, spec: &[(u8, Vec<usize>, u8)], choices: &[Vec<usize>]) -> Model {
        let mut m = Model::default();
        let vars: Vec<Var> = (0..n).map(|i| m.var(format!("v{i}"))).collect();
        for (kind, vs, bits) in spec {
            let vs: Vec<Var> = vs.iter().map(|&i| vars[i % n]).collect();
            let kind = match kind % 3 {
                0 => ConstraintKind::Clause(
                    vs.iter()
                        .enumerate()
                        .map(|(k, v)| {
                            if bits >> (k % 8) & 1 == 1 {
                                v.pos()
                            } else {
                                v.negative()
                            }
                        })
                        .collect(),
                ),
                1 => ConstraintKind::ExactlyOne(vs),
                _ => ConstraintKind::AtMostOne(vs),
            };
            m.require(kind, "random");
        }
        for c in choices {
            m.choices.push(Choice {
                options: c.iter().map(|&i| vars[i % n]).collect(),
            });
        }
        m
    }

    proptest! {
        /// The iterative search returns what the recursive one did, step limit included.
        #[test]
        fn search_matches_the_recursive_search(
            n in 1usize..12,
            spec in prop::collection::vec((0u8..3, prop::collection::vec(0usize..12, 0..4), 0u8..=255), 0..14),
            choices in prop::collection::vec(prop::collection::vec(0usize..12, 1..4), 0..4),
            max_steps in 1usize..200,
        ) {
            let m = model(n, &spec, &choices);
            prop_assert_eq!(m.search(max_steps), recursive_search(&m, max_steps));
        }
    }

    /// A chain of 200,000 variables (each implies the next) is searched without a deep call
    /// stack, in time linear in the model.
    #[test]
    fn long_chains_need_no_deep_stack() {
        let mut m = Model::default();
        let vars: Vec<Var> = (0..200_000).map(|i| m.var(format!("v{i}"))).collect();
        for w in vars.windows(2) {
            m.require(
                ConstraintKind::Clause(vec![w[0].negative(), w[1].pos()]),
                "chain",
            );
        }
        m.require(ConstraintKind::Clause(vec![vars[0].pos()]), "first");
        m.choices.push(Choice {
            options: vars.clone(),
        });
        let t = std::time::Instant::now();
        let sol = m.search(1_000_000).expect("all true is feasible");
        assert!(sol.iter().all(|&b| b));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn search_respects_preferences_and_constraints() {
        let mut m = Model::default();
        let a: Vec<Var> = (0..3).map(|i| m.var(format!("a{i}"))).collect();
        let s = m.var("s");
        m.require(ConstraintKind::ExactlyOne(a.clone()), "pick one");
        // a2 needs s, a0 forbids s, and s is required.
        m.require(
            ConstraintKind::Clause(vec![a[2].negative(), s.pos()]),
            "a2 => s",
        );
        m.require(
            ConstraintKind::Clause(vec![a[0].negative(), s.negative()]),
            "a0 => !s",
        );
        m.require(ConstraintKind::Clause(vec![s.pos()]), "s");
        m.choices.push(Choice {
            options: vec![a[0], a[2], a[1]],
        });
        let sol = m.search(1000).unwrap();
        assert!(m.check(&sol).is_none());
        assert_eq!(
            sol,
            vec![false, false, true, true],
            "a0 is infeasible, a2 is next"
        );
        m.cost(vec![a[2].pos()], 5);
        assert_eq!(m.total_cost(&sol), 5);
        m.require(ConstraintKind::Clause(vec![a[2].negative()]), "not a2");
        m.require(ConstraintKind::Clause(vec![a[1].negative()]), "not a1");
        assert!(m.search(1000).is_none());
        assert_eq!(m.check(&sol).unwrap().origin, "not a2");
    }
}
