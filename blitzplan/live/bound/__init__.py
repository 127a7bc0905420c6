"""Lower bounds on the live-scaling problem (DESIGN.md section 4), valid for every schedule.

Each bound relaxes a rule of the problem and solves what is left exactly; the exact search
(:mod:`blitzplan.live.exact`) takes the largest at its root and nodes, and :mod:`.printed` shows
one beside a heuristic's schedule.

- :mod:`.relaxation`: the N-capacity relaxation (N runs any number of operations at once), the
  model the others build on; :mod:`.dp` solves it, by dynamic programs over O's order, and
  :mod:`.subsets` is its subset program on numpy (its table: :mod:`.subset_table`, its counted
  time: :mod:`.subset_cost`);
  :mod:`.fronts` is the Pareto merge of their states (and of :mod:`.lagrange`'s).
- :mod:`.conditions` puts N's capacity back into that program as necessary conditions (with
  :mod:`.splits` for the split apart, :mod:`.served_blocks` for every served block under FIFO),
  :mod:`.busy` charges N's work to the last completion,
  :mod:`.ranks` to every batch N finishes and :mod:`.deadlines` to each of O's served blocks;
  :mod:`.last_blocks` (free order) to O's last two blocks and the batches left on N
  (:mod:`.forced_idle`: with the idle N cannot avoid while the layers land;
  :mod:`.pair_history`: with O's waits and the block that ends O's served work);
  :mod:`.subset_lifts` counts which batches N finishes first from their releases and the
  layers' arrivals.
- :mod:`.work`: both instances as one preemptive machine (microseconds); :mod:`.plan_floor`:
  the least any schedule of a relaxed plan's splits and O order can be (what the exact search
  checks before it repairs a plan).
- :mod:`.lagrange` (FIFO) prices N's capacity per window of layers into O's sequencing
  (:mod:`.lagrange_prices`); :mod:`.slots` (either order) prices both instances' capacity per
  time slot (:mod:`.slot_prices`, :mod:`.slot_blocks`, :mod:`.slot_chains`, the master LP in
  :mod:`.master`); :mod:`.polyak` steps their subgradient ascents.
"""
