// Text boxes of PipeTrain's nodes: the read-only summary box a node's returned text shows in (Train Pipeline,
// Save LoRA, the dataset nodes' reports), sized to its wrapped lines, and the name drawn above a multiline box's
// text (the frontend shows it only as a placeholder, gone once the box holds text). Used by pipetrain.js.

const SUMMARY_LINES = 8; // the summary box grows with its text up to this many lines, then scrolls

export function fitNode(node) {
  // Grow the node to what its widgets need (never shrink what the user or the workflow chose).
  const [w, h] = node.computeSize();
  node.setSize([Math.max(node.size[0], w), Math.max(node.size[1], h)]);
}

export function showText(node, text) {
  let widget = node.widgets?.find((w) => w.name === "pipetrain_summary");
  if (!widget) {
    // A read-only text box of our own (a DOM widget), not the frontend's STRING widget factory.
    const box = document.createElement("textarea");
    box.className = "pipetrain-summary";
    box.readOnly = true;
    box.spellcheck = false;
    // Long lines (a LoRA path) wrap instead of being cut at the box's edge.
    box.style.cssText = "width:100%;height:100%;box-sizing:border-box;resize:none;white-space:pre-wrap;"
      + "overflow-wrap:anywhere;overflow:auto;"
      + "font:11px/14px monospace;color:var(--descrip-text,#aaa);background:var(--comfy-input-bg,#222);"
      + "border:1px solid var(--border-color,#444);border-radius:4px;padding:4px;";
    // As tall as its lines (up to SUMMARY_LINES), so a one-line summary does not push into the node
    // below; the frontend takes the widget's margin (above and below the box) out of this height.
    // The box's text width: its own once it is on the page, else the node's less margins, padding and border.
    const textWidth = () => (box.clientWidth ? box.clientWidth - 8 : node.size[0] - 2 * (widget?.margin ?? 4) - 10);
    const lines = () => Math.min(SUMMARY_LINES, wrappedLines(box.value, textWidth()));
    const height = () => lines() * 14 + 12 + 2 * (widget?.margin ?? 10);
    widget = node.addDOMWidget("pipetrain_summary", "pipetrain_summary", box, {
      serialize: false, // display only: never saved into the workflow's widget values
      hideOnZoom: false,
      margin: 4,
      getValue: () => box.value,
      setValue: (v) => { box.value = v ?? ""; },
      getMinHeight: height,
      getMaxHeight: height,
    });
    widget.serialize = false;
    // Nodes 2.0 (Vue nodes) gives the box what is left of the node's height, not getMinHeight: its minimum
    // height makes that renderer grow the node to show its lines.
    widget.fitBox = () => { box.style.minHeight = `${lines() * 14 + 12}px`; };
  }
  widget.value = text;
  widget.fitBox();
  fitNode(node);
  requestAnimationFrame(() => { widget.fitBox(); fitNode(node); }); // again once the box has its width on the page
  node.setDirtyCanvas(true, true);
}

let monoWidth = 0; // px a character of the summary box's 11px monospace font
function wrappedLines(text, width) {
  // Lines the box shows once long ones wrap.
  if (!monoWidth) {
    const ctx = document.createElement("canvas").getContext("2d");
    if (ctx) {
      ctx.font = "11px monospace";
      monoWidth = ctx.measureText("0123456789").width / 10;
    }
  }
  const columns = Math.max(10, Math.floor(width / (monoWidth || 6.7)));
  let count = 0;
  for (const line of text.split("\n")) {
    // Greedy word wrap as the browser does it: a word that does not fit the rest of the line starts the
    // next one, a word longer than a line is broken.
    let used = 0;
    count += 1;
    for (const word of line.split(" ")) {
      const need = used ? used + 1 + word.length : word.length;
      if (need <= columns) used = need;
      else {
        count += used ? 1 : 0;
        count += Math.floor(Math.max(0, word.length - 1) / columns);
        used = word.length % columns || columns;
      }
    }
  }
  return count;
}

export function labelBox(widget) {
  // A multiline box shows its name only as a placeholder, gone once it holds text: draw the name in
  // the box's top padding (a background image, so the frontend's own element and value stay as they are).
  const box = widget?.inputEl || widget?.element;
  if (!(box instanceof HTMLTextAreaElement) || box.dataset.pipetrainLabel) return;
  const name = String(widget.label || widget.name).replace(/[<>&"]/g, "");
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${name.length * 7 + 8}" height="14">`
    + `<text x="3" y="10" font-family="sans-serif" font-size="10" fill="#8c8c8c">${name}</text></svg>`;
  box.dataset.pipetrainLabel = name;
  if (box.placeholder === widget.name) box.placeholder = ""; // the label says it already (a real hint stays)
  box.style.backgroundImage = `url("data:image/svg+xml,${encodeURIComponent(svg)}")`;
  box.style.backgroundRepeat = "no-repeat";
  box.style.backgroundPosition = "left 2px top 1px";
  box.style.paddingTop = "15px";
  // Room for the label and three lines of text (the frontend reads a DOM widget's minimum from this variable).
  box.style.setProperty("--comfy-widget-min-height", "64");
}
