// Unit tests of web/chart.js and web/chart_draw.js (pure code: state reducer, smoothing, ETA, ticks, layout, drawing).
// Run: node --test tests/ui/   (tests/unit/test_ui_chart.py runs them in CI)
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  applyEvent, applyMessage, autoWeight, downsample, emptyRun, etaSeconds, formatDuration, formatNorm, layout,
  loadingDetail, nearestStep, niceRange, niceTicks, planText, runMatches, smooth, stateFromSnapshot, statusLine, xEnd,
} from "../../web/chart.js";
import { drawChart } from "../../web/chart_draw.js";

const step = (s, loss, t, lr = 1e-3) => ({ event: "step", step: s, total: 10, loss, lr, time: t });

test("smoothing is debiased: a constant series stays constant, a step change is followed gradually", () => {
  assert.deepEqual(smooth([2, 2, 2], 0.9).map((v) => +v.toFixed(12)), [2, 2, 2]);
  const s = smooth([0, 0, 0, 10, 10, 10], 0.5);
  assert.equal(s[2], 0);
  assert.ok(s[3] > 0 && s[3] < 10 && s[4] > s[3] && s[5] > s[4] && s[5] < 10);
  assert.deepEqual(smooth([1, 5, 3], 0), [1, 5, 3]);
  assert.equal(smooth([1, NaN, 3], 0.5)[1], 1); // a non-finite loss does not poison the curve
});

test("auto smoothing grows with the number of points and stays below 1", () => {
  assert.ok(autoWeight(5) < autoWeight(100) && autoWeight(100) < autoWeight(100000));
  assert.ok(autoWeight(1e9) <= 0.98);
});

test("events build the run: steps in order, a resumed run's repeated steps replaced, status follows", () => {
  let st = emptyRun("r", 10);
  applyEvent(st, { event: "started", step: 0, total: 10 });
  assert.equal(st.status, "training");
  [step(1, 1.0, 100), step(2, 0.8, 101), step(3, 0.7, 102)].forEach((e) => applyEvent(st, e));
  applyEvent(st, step(2, 0.5, 200)); // resumed from step 1
  assert.deepEqual(st.steps.map((r) => [r[0], r[1]]), [[1, 1.0], [2, 0.5], [3, 0.7]]);
  applyEvent(st, { event: "sampling", step: 3 });
  assert.equal(st.status, "sampling");
  applyEvent(st, { event: "sample", step: 3 });
  assert.equal(st.status, "training");
  applyEvent(st, { event: "error", message: "CacheError: damaged file" });
  assert.equal(st.status, "failed");
  assert.match(statusLine(st), /failed .* — CacheError: damaged file/);
});

test("messages: reset starts over, samples replace the same step, status overrides", () => {
  let st = applyMessage(null, { type: "reset", run: "a", total: 5 });
  assert.equal(st.status, "loading");
  st = applyMessage(st, { type: "event", run: "a", event: step(1, 0.3, 1) });
  st = applyMessage(st, { type: "samples", run: "a", step: 1, images: [{ filename: "x.png" }] });
  st = applyMessage(st, { type: "samples", run: "a", step: 1, images: [{ filename: "y.png" }] });
  assert.equal(st.samples.length, 1);
  assert.equal(st.samples[0].images[0].filename, "y.png");
  st = applyMessage(st, { type: "status", run: "a", status: "cancelled" });
  assert.equal(st.status, "cancelled");
  st = applyMessage(st, { type: "event", run: "b", event: step(1, 9, 1) }); // another run on the same node
  assert.equal(st.run, "b");
  assert.equal(st.steps.length, 1);
});

test("a long run's state keeps the newest 8 samples and 16 warnings, however many arrive", () => {
  let st = applyMessage(null, { type: "reset", run: "a", total: 1000 });
  for (let s = 5; s <= 1000; s += 5) {
    st = applyMessage(st, { type: "samples", run: "a", step: s, images: [{ filename: `step${s}_p0.png` }], prompts: ["p"] });
    st = applyMessage(st, { type: "event", run: "a", event: { event: "warning", message: `could not decode step ${s}` } });
  }
  assert.deepEqual(st.samples.map((x) => x.step), [965, 970, 975, 980, 985, 990, 995, 1000]);
  assert.equal(st.warnings.length, 16);
  assert.equal(st.warnings[15], "could not decode step 1000");
});

test("a snapshot (page reload) rebuilds the same state as the live messages", () => {
  const events = [{ event: "started", step: 0, total: 10 }, step(1, 1, 10), step(2, 0.9, 11), { event: "sampling", step: 2 },
    { event: "sample", step: 2, path: "p" }];
  const samples = [{ step: 2, images: [{ filename: "s.png" }], prompts: ["a"] }];
  let live = applyMessage(null, { type: "reset", run: "r", total: 10 });
  for (const e of events) live = applyMessage(live, { type: "event", run: "r", event: e });
  live = applyMessage(live, { type: "samples", run: "r", ...samples[0] });
  const snap = stateFromSnapshot({ run: "r", total: 10, status: "training", events, samples });
  assert.deepEqual(snap, live);
});

test("ETA from the pace of recent steps; unknown until two steps", () => {
  assert.equal(etaSeconds([[1, 1, 0, 100]], 10), null);
  assert.equal(etaSeconds([[1, 1, 0, 100], [3, 1, 0, 104]], 11), 16); // 2 s/step x 8 steps left
  assert.equal(etaSeconds([[1, 1, 0, 100], [10, 1, 0, 104]], 10), 0);
  assert.equal(formatDuration(16), "0:16");
  assert.equal(formatDuration(3725), "1:02:05");
  assert.equal(formatDuration(null), "?");
  const st = emptyRun("r", 11);
  st.status = "training";
  st.steps = [[1, 0.5, 0, 100], [3, 0.25, 0, 104]];
  assert.equal(statusLine(st), "training · step 3/11 · loss 0.2500 · ETA 0:16");
});

test("ticks are round numbers inside the range", () => {
  assert.deepEqual(niceTicks(0, 100, 5), [0, 20, 40, 60, 80, 100]);
  assert.deepEqual(niceTicks(0.013, 0.047, 4), [0.02, 0.03, 0.04]);
  assert.deepEqual(niceTicks(3, 3), [3]);
});

test("the loss axis has 5-6 round ticks and covers the data", () => {
  for (const [lo, hi] of [[0.0123, 0.0456], [0.09, 0.21], [1, 1000], [0.5, 0.52], [-3, 7], [0.2, 3.1]]) {
    const r = niceRange(lo, hi);
    assert.ok(r.ticks.length >= 5 && r.ticks.length <= 6, `${lo}..${hi}: ${r.ticks}`);
    assert.ok(r.min <= lo && r.max >= hi && r.ticks[0] === r.min && r.ticks[r.ticks.length - 1] === r.max, `${lo}..${hi}`);
    const mantissa = r.step / Math.pow(10, Math.floor(Math.log10(r.step)));
    assert.ok([1, 2, 2.5, 5].some((f) => Math.abs(mantissa - f) < 1e-9), `step ${r.step}`);
  }
  const L = layout([[1, 0.09, 0, 0], [10, 0.21, 0, 0]], 10, 300, 200);
  assert.ok(L.yTicks.length >= 5 && L.yTicks.length <= 6 && L.y0 === L.yTicks[0], String(L.yTicks));
});

test("downsampling keeps spikes and the point count bounded", () => {
  const pts = Array.from({ length: 10000 }, (_, i) => [i, i === 5000 ? 100 : 1]);
  const d = downsample(pts, 200);
  assert.ok(d.length <= 200);
  assert.ok(d.some((p) => p[1] === 100));
  assert.equal(downsample(pts.slice(0, 10), 200).length, 10);
});

test("layout maps the first/last step and the loss range into the plot area", () => {
  const L = layout([[1, 0.5, 0, 0], [10, 1.5, 0, 0]], 10, 300, 200);
  assert.equal(L.sx(0), L.pad.left);
  assert.equal(L.sx(10), 300 - L.pad.right);
  assert.ok(L.sy(1.5) > L.pad.top && L.sy(0.5) < 200 - L.pad.bottom && L.sy(1.5) < L.sy(0.5));
  assert.ok(Math.abs(L.stepAt(L.sx(7)) - 7) < 1e-9);
  assert.deepEqual(nearestStep([[1], [5], [9]], 6.9), [5]);
  assert.deepEqual(nearestStep([[1], [5], [9]], 7.1), [9]);
  // the x axis spans the whole run from its first step (and before it); without a total, the steps seen
  assert.equal(xEnd(6, 100000), 100000);
  assert.equal(xEnd(0, 60), 60);
  assert.equal(xEnd(12, 0), 12);
  assert.equal(layout([], 60, 300, 200).x1, 60);
});

function recorder() {
  const calls = [];
  return new Proxy({ calls }, {
    get(target, prop) {
      if (prop in target) return target[prop];
      return (...args) => calls.push([prop, ...args]);
    },
    set(target, prop, value) {
      calls.push(["set", prop, value]);
      return true;
    },
  });
}

test("drawing: raw and smoothed polylines over every step, hover shows the step's LR", () => {
  const st = emptyRun("r", 4);
  [step(1, 1.0, 1, 0.001), step(2, 0.5, 2, 0.002), step(3, 0.75, 3, 0.003), step(4, 0.25, 4, 0.004)]
    .forEach((e) => applyEvent(st, e));
  const ctx = recorder();
  const { layout: L, hover } = drawChart(ctx, st, 400, 200, null);
  assert.equal(hover, null);
  const lineTos = ctx.calls.filter((c) => c[0] === "lineTo").length;
  assert.ok(lineTos >= 2 + 3 + 3, `expected two 4-point polylines, got ${lineTos} lineTo calls`);
  const ctx2 = recorder();
  const drawn = drawChart(ctx2, st, 400, 200, L.sx(3) + 1);
  assert.equal(drawn.hover.step, 3);
  assert.equal(drawn.hover.lr, 0.003);
  assert.ok(ctx2.calls.some((c) => c[0] === "fillText" && /lr 3\.00e-3/.test(c[1])));
  const empty = recorder();
  drawChart(empty, emptyRun(), 400, 200);
  assert.ok(empty.calls.some((c) => c[0] === "fillText" && /loss appears here/.test(c[1])));
});

test("eval events: one point per step in step order, in the y range, drawn as markers, shown on hover", () => {
  const st = emptyRun("r", 4);
  [step(1, 1.0, 1), step(2, 0.5, 2), step(3, 0.75, 3), step(4, 0.25, 4)].forEach((e) => applyEvent(st, e));
  for (const [s, loss] of [[4, 0.2], [0, 3.0], [4, 0.1]]) applyEvent(st, { event: "eval", step: s, loss });
  applyEvent(st, { event: "eval", step: 2, loss: NaN });
  assert.deepEqual(st.evals, [[0, 3.0], [4, 0.1]]);
  const ctx = recorder();
  const { layout: L } = drawChart(ctx, st, 400, 200, null);
  assert.ok(L.y1 > 3.0 && L.y0 < 0.1, "eval losses outside the y range");
  assert.equal(ctx.calls.filter((c) => c[0] === "fillRect").length, 2);
  const hovered = drawChart(recorder(), st, 400, 200, L.sx(4));
  assert.equal(hovered.hover.eval, 0.1);
  const snap = stateFromSnapshot({ run: "r", total: 4, events: [{ event: "eval", step: 0, loss: 2 }] });
  assert.deepEqual(snap.evals, [[0, 2]]);
});

test("grad norm: kept per step, in the status line and the hover readout, absent for runs without it", () => {
  const st = emptyRun("r", 4);
  applyEvent(st, { ...step(1, 1.0, 1), grad_norm: 0.01234 });
  applyEvent(st, { ...step(2, 0.5, 2), grad_norm: 4567.8 });
  applyEvent(st, { ...step(3, 0.4, 3), grad_norm: null }); // a NaN norm reaches the page as null
  assert.deepEqual(st.steps.map((r) => r[4]), [0.01234, 4567.8, null]);
  assert.doesNotMatch(statusLine(st), /grad norm/);
  applyEvent(st, { ...step(4, 0.3, 4), grad_norm: 2.5 });
  assert.match(statusLine(st), /loss 0\.3000 · grad norm 2\.5 · /);
  assert.equal(formatNorm(0.01234), "0.0123");
  assert.equal(formatNorm(4567.8), "4570");
  assert.equal(formatNorm(12345), "1.23e+4");
  const ctx = recorder();
  const { layout: L } = drawChart(ctx, st, 400, 200, null);
  const hovered = drawChart(ctx, st, 400, 200, L.sx(1));
  assert.equal(hovered.hover.gradNorm, 0.01234);
  assert.ok(ctx.calls.some((c) => c[0] === "fillText" && /lr 1\.00e-3 {2}grad 0\.0123/.test(c[1])));
  assert.equal(drawChart(recorder(), st, 400, 200, L.sx(3)).hover.gradNorm, null);
  const old = emptyRun("r", 4);
  applyEvent(old, step(1, 1.0, 1));
  assert.equal(old.steps[0][4], null);
  assert.doesNotMatch(statusLine(old), /grad norm/);
});

test("the chart reads without hovering: axis titles, legend, LR on its own axis, the newest eval labelled", () => {
  const st = emptyRun("r", 60);
  [step(1, 1.0, 1, 0.001), step(2, 0.5, 2, 0.002), step(3, 0.75, 3, 0.002)].forEach((e) => applyEvent(st, e));
  applyEvent(st, { event: "eval", step: 2, loss: 0.6 });
  st.total = 60; // the run's total (the helper's events say 10)
  const ctx = recorder();
  const { layout: L } = drawChart(ctx, st, 400, 200, null);
  const texts = ctx.calls.filter((c) => c[0] === "fillText").map((c) => c[1]);
  for (const label of ["step", "loss", "smoothed", "eval", "LR (right axis)", "eval 0.6000", "2.0e-3", "60"]) {
    assert.ok(texts.includes(label), `${label} not drawn: ${texts}`);
  }
  assert.equal(L.x1, 60, "the x axis spans the whole run");
  const yLabels = L.yTicks.map(String);
  assert.ok(yLabels.length >= 5 && yLabels.every((v) => texts.includes(v)), `${yLabels} vs ${texts}`);
  const before = recorder();
  drawChart(before, emptyRun("", 60), 400, 200);
  assert.ok(before.calls.some((c) => c[0] === "fillText" && c[1] === "60"), "before a run the axis ends at steps");
});

test("a node restores only the run its settings name: run_name (or its _N twin), or the run it resumes", () => {
  assert.ok(runMatches("demo", { runName: "demo" }) && runMatches("demo_3", { runName: " demo " }));
  assert.ok(!runMatches("demo_x", { runName: "demo" }) && !runMatches("ui_browser_1", { runName: "demo" }));
  assert.ok(!runMatches("demo", { runName: "" }) && !runMatches("", { runName: "demo" }));
  assert.ok(runMatches("old", { runName: "demo", resume: "old" }) && !runMatches("demo", { runName: "demo", resume: "old" }));
  assert.ok(runMatches("anything", { runName: "demo", resume: "latest" }));
});

test("a failed run keeps its error and the log's last lines, live and after a reload", () => {
  const log = ["Traceback (most recent call last):", "RuntimeError: out of memory"];
  let live = applyMessage(null, { type: "reset", run: "r", total: 10 });
  live = applyMessage(live, { type: "status", run: "r", status: "failed", reason: "out of memory", log });
  assert.equal(live.status, "failed");
  assert.deepEqual(live.log, log);
  assert.match(statusLine(live), /^failed — out of memory$/);
  const snap = stateFromSnapshot({ run: "r", total: 10, status: "failed", reason: "out of memory", log, events: [] });
  assert.deepEqual(snap, live);
});

test("while loading, the status line says what the rank does and for how long", () => {
  const st = applyMessage(undefined, { type: "reset", run: "r", total: 60 });
  assert.equal(statusLine(st), "loading the model"); // before the rank's first setup event
  applyEvent(st, { event: "setup", phase: "node_checks", since: 1000, time: 1005 });
  assert.equal(loadingDetail(st, 1012), "reading the model file · 0:12");
  applyEvent(st, { event: "setup", phase: "block_probe", time: 1030 });
  assert.equal(loadingDetail(st, 1031), "adding the LoRA · 0:31");
  applyEvent(st, { event: "started", step: 0, total: 60 });
  applyEvent(st, { event: "step", step: 1, total: 60, loss: 0.5, lr: 1e-4, time: 1040 });
  assert.doesNotMatch(statusLine(st), /LoRA ·|0:3/); // training: no loading detail
  // a reloaded page: the same, from the setup event it has
  const snap = stateFromSnapshot({ run: "r", total: 60, events: [{ event: "setup", phase: "model_load", since: 2000,
    time: 2004 }] });
  assert.equal(loadingDetail(snap, 2007), "checking the block forwards · 0:07");
});

test("a fit memory plan shows on the status line: the choice, its predicted peak and s/step, then step 1's peak", () => {
  const chosen = { checkpointing: "on", block_swap: 6, fp8: false, optimizer: "adamw", peak_gib: 21.25, seconds: 13.2 };
  let st = applyEvent(emptyRun("r", 10), { event: "memory_plan", chosen, budget_gib: 24, reused: false });
  assert.equal(st.plan, "plan: checkpointing on, block swap 6, adamw, 21.25/24 GiB, ~13.20 s/step");
  assert.ok(statusLine(st).includes(st.plan));
  applyEvent(st, { event: "memory_plan_check", step: 1, measured_peak_gib: 20.9 });
  assert.ok(statusLine(st).endsWith("~13.20 s/step · step 1 peak 20.90 GiB"), statusLine(st));
  assert.equal(planText({ chosen: null, budget_gib: 8 }), "plan: nothing fits in 8 GiB");
  assert.ok(planText({ chosen: { ...chosen, fp8: true, block_swap: 0 }, budget_gib: 24, reused: true })
    .startsWith("plan (saved): checkpointing on, fp8 base, adamw"));
});
