// The loss chart of PipeTrain's training view, drawn on any CanvasRenderingContext2D-like object (pure,
// like chart.js, whose layout and series it draws; tests/ui/chart.test.mjs runs it under plain node).
import { PAD, autoWeight, downsample, formatNorm, layout, nearestStep, niceTicks, smooth } from "./chart.js";

export const COLORS = { raw: "rgba(120,160,255,0.55)", smooth: "#4c8dff", axis: "#888", grid: "rgba(136,136,136,0.18)",
  text: "#ccc", hover: "#ffb347", eval: "#5fd38d", lr: "#d9a0ff" };

function polyline(ctx, pts, sx, sy) {
  ctx.beginPath();
  pts.forEach(([s, v], i) => (i ? ctx.lineTo(sx(s), sy(v)) : ctx.moveTo(sx(s), sy(v))));
  ctx.stroke();
}

/** An axis label in at most 3 significant digits ("0.25", "120", "2.0e-4"). */
export function formatTick(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e-3 && a < 1e5 ? String(Number(v.toPrecision(3))) : v.toExponential(1);
}

/** The legend above the plot: [label, color, "line" | "dash" | "box"] entries from the left. */
function drawLegend(ctx, entries, x, y) {
  for (const [label, color, kind] of entries) {
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    if (kind === "box") ctx.fillText("\u25A0", x, y + 3);
    else {
      ctx.lineWidth = kind === "smooth" ? 2 : 1.5;
      ctx.setLineDash(kind === "dash" ? [3, 2] : []);
      ctx.beginPath();
      ctx.moveTo(x, y);
      ctx.lineTo(x + 12, y);
      ctx.stroke();
      ctx.setLineDash([]);
    }
    ctx.fillStyle = COLORS.text;
    ctx.fillText(label, x + 15, y + 3);
    x += 15 + label.length * 5.5 + 12; // ~5.5 px a character at 10px sans-serif
  }
  ctx.lineWidth = 1;
}

/** Draw the loss chart: axes titled (step, loss) with round ticks, the x axis over the whole run, raw
 *  and smoothed loss, eval losses as green squares (the newest labelled with its value), the learning
 *  rate as a dashed line on its own right-hand axis, and a legend. When hoverPx is set, the hovered
 *  step's loss, LR, gradient norm and eval loss are read out. Returns what was drawn ({layout, hover}),
 *  for tests and the caller's tooltip. */
export function drawChart(ctx, state, width, height, hoverPx = null) {
  ctx.clearRect(0, 0, width, height);
  const evals = state.evals || [];
  const L = layout(state.steps, state.total, width, height, PAD, evals.map((r) => r[1]));
  const bottom = height - L.pad.bottom;
  const right = width - L.pad.right;
  ctx.lineWidth = 1;
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  ctx.strokeStyle = COLORS.grid;
  ctx.fillStyle = COLORS.text;
  for (const v of L.yTicks) {
    ctx.beginPath();
    ctx.moveTo(L.pad.left, L.sy(v));
    ctx.lineTo(right, L.sy(v));
    ctx.stroke();
    const label = formatTick(v);
    ctx.fillText(label, L.pad.left - 4 - label.length * 5.5, L.sy(v) + 3);
  }
  ctx.strokeStyle = COLORS.axis;
  ctx.beginPath();
  ctx.moveTo(L.pad.left, L.pad.top);
  ctx.lineTo(L.pad.left, bottom);
  ctx.lineTo(right, bottom);
  ctx.stroke();
  for (const s of niceTicks(L.x0, L.x1, 5)) ctx.fillText(String(s), L.sx(s) - String(s).length * 2.75, bottom + 12);
  ctx.fillText("step", (L.pad.left + right) / 2 - 10, height - 3);
  ctx.save();
  ctx.translate(10, (L.pad.top + bottom) / 2 + 10);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText("loss", 0, 0);
  ctx.restore();

  const lrs = state.steps.map((r) => r[2]).filter((v) => Number.isFinite(v) && v > 0);
  const lrTop = lrs.length ? Math.max(...lrs) * 1.1 : 0;
  const legend = [["loss", COLORS.raw, "line"], ["smoothed", COLORS.smooth, "smooth"]];
  if (evals.length) legend.push(["eval", COLORS.eval, "box"]);
  if (lrTop) legend.push(["LR (right axis)", COLORS.lr, "dash"]);
  drawLegend(ctx, legend, L.pad.left + 4, 8);
  if (!state.steps.length) {
    ctx.fillStyle = COLORS.text;
    ctx.fillText("loss appears here once training steps arrive", L.pad.left + 8, L.pad.top + 14);
    return { layout: L, hover: null };
  }
  const maxPts = Math.max(2, Math.floor(width - L.pad.left - L.pad.right) * 2);
  const raw = downsample(state.steps.map((r) => [r[0], r[1]]), maxPts);
  const sm = smooth(state.steps.map((r) => r[1]), autoWeight(state.steps.length));
  const smoothPts = downsample(state.steps.map((r, i) => [r[0], sm[i]]), maxPts);
  if (lrTop) {
    // The LR on its own scale (0 at the bottom, the right axis labelled with its peak and half of it).
    const ly = (v) => L.pad.top + (1 - v / lrTop) * (bottom - L.pad.top);
    ctx.strokeStyle = COLORS.lr;
    ctx.setLineDash([3, 2]);
    polyline(ctx, downsample(state.steps.map((r) => [r[0], r[2]]), maxPts), L.sx, ly);
    ctx.setLineDash([]);
    ctx.fillStyle = COLORS.lr;
    for (const v of [lrTop / 1.1, lrTop / 2.2]) ctx.fillText(v.toExponential(1), right + 3, ly(v) + 3);
  }
  ctx.strokeStyle = COLORS.raw;
  polyline(ctx, raw, L.sx, L.sy);
  ctx.strokeStyle = COLORS.smooth;
  ctx.lineWidth = 2;
  polyline(ctx, smoothPts, L.sx, L.sy);
  ctx.lineWidth = 1;
  if (evals.length) {
    ctx.fillStyle = COLORS.eval;
    for (const [s, v] of evals) ctx.fillRect(L.sx(s) - 3, L.sy(v) - 3, 6, 6);
    const [s, v] = evals[evals.length - 1];
    const label = `eval ${v.toFixed(4)}`;
    const x = Math.min(L.sx(s) + 5, right - label.length * 5.5);
    ctx.fillText(label, x, Math.max(L.pad.top + 9, L.sy(v) - 5));
  }
  let hover = null;
  if (hoverPx !== null && hoverPx >= L.pad.left) {
    const rec = nearestStep(state.steps, L.stepAt(hoverPx));
    if (rec) {
      const i = state.steps.indexOf(rec);
      const ev = evals.find((r) => r[0] === rec[0]);
      const norm = Number.isFinite(rec[4]) ? rec[4] : null;
      hover = { step: rec[0], loss: rec[1], smoothed: sm[i], lr: rec[2], eval: ev ? ev[1] : null, gradNorm: norm };
      ctx.strokeStyle = COLORS.hover;
      ctx.beginPath();
      ctx.moveTo(L.sx(rec[0]), L.pad.top);
      ctx.lineTo(L.sx(rec[0]), bottom);
      ctx.stroke();
      ctx.fillStyle = COLORS.hover;
      const label = `step ${rec[0]}  loss ${rec[1].toFixed(4)}  smoothed ${sm[i].toFixed(4)}  lr ${rec[2].toExponential(2)}` +
        (norm !== null ? `  grad ${formatNorm(norm)}` : "") + (ev ? `  eval ${ev[1].toFixed(4)}` : "");
      ctx.fillText(label, L.pad.left + 4, L.pad.top + 10);
    }
  }
  return { layout: L, hover };
}
