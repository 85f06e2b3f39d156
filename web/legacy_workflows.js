// Workflows saved before Train Pipeline's rarely changed settings moved to PipeTrain Train Options.
// The frontend stores widget values by position (widgets_values), so an old Train Pipeline's list is
// read by the old input order: the settings it still has get their values by name, and the moved ones go
// to a Train Options node that is added beside it and connected to its `options` input (only when one
// of them differs from its default, as a new workflow would leave the node out). API-format prompts
// are converted on the server (nodes/legacy_prompts.py).
import { app } from "../../scripts/app.js";

const OPTIONS_NODE = "PipeTrainTrainOptions";
// Train Pipeline's widgets before the move, in order. Older saves stop earlier (32 values before
// accept_changes was added, 33 before ema_decay / ema_start_step).
const OLD_WIDGETS = ["model_name", "steps", "epochs", "learning_rate", "scheduler", "warmup_steps", "batch_size",
  "grad_accum", "seed", "save_every", "checkpoint_every", "num_gpus", "run_name", "resume", "gpu_ids",
  "timestep_sampling", "timestep_shift", "backend", "sample_prompts", "sample_negative", "sample_every",
  "sample_width", "sample_height", "sample_steps", "sample_cfg", "sample_seed", "sample_sampler",
  "sample_scheduler", "eval_every", "eval_before_start", "min_t", "max_t", "accept_changes", "ema_decay",
  "ema_start_step"];
const OLDEST_LENGTH = 32;

/** The old layout's values by name, or null when `values` is not an old Train Pipeline's list. */
export function oldValues(values, currentCount) {
  if (!Array.isArray(values) || values.length < OLDEST_LENGTH || values.length > OLD_WIDGETS.length
      || values.length <= currentCount) return null;
  return Object.fromEntries(values.map((v, i) => [OLD_WIDGETS[i], v]));
}

/** Called from Train Pipeline's onConfigure: set its own widgets from an old list and keep the moved
 *  values for `addOptionsNode` (run once the whole graph is loaded). */
export function convertOldNode(node, info) {
  const serialized = (node.widgets || []).filter((w) => w.serialize !== false);
  const old = oldValues(info?.widgets_values, serialized.length);
  if (!old) return;
  const moved = {};
  for (const [name, value] of Object.entries(old)) {
    const widget = serialized.find((w) => w.name === name);
    if (widget) widget.value = value;
    else moved[name] = value;
  }
  // The saved slots of widgets that are gone (unconnected) would stay as stray sockets.
  for (let i = (node.inputs || []).length - 1; i >= 0; i--) {
    const input = node.inputs[i];
    if (input.widget && input.link == null && !serialized.some((w) => w.name === input.widget.name)) node.removeInput(i);
  }
  node.pipetrainMoved = moved;
}

/** After the graph has loaded: the Train Options node that holds an old node's moved settings. */
export function addOptionsNode(node) {
  const moved = node.pipetrainMoved;
  delete node.pipetrainMoved;
  const slot = node.findInputSlot?.("options") ?? -1;
  if (!moved) return null;
  node.setSize([node.size[0], node.computeSize()[1]]); // its widgets are all in place now
  if (slot < 0 || node.inputs[slot].link != null) return null;
  const options = window.LiteGraph.createNode(OPTIONS_NODE);
  if (!options) return null;
  let changed = false;
  for (const widget of options.widgets || []) {
    if (!(widget.name in moved) || moved[widget.name] === widget.value) continue;
    widget.value = moved[widget.name];
    changed = true;
  }
  if (!changed) return null; // every moved setting at its default: the node is not needed
  options.pos = [node.pos[0], node.pos[1] + node.size[1] + 2 * window.LiteGraph.NODE_TITLE_HEIGHT];
  app.graph.add(options);
  options.connect(0, node, slot);
  return options;
}
