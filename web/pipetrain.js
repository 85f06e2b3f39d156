// PipeTrain: show the text summary that TrainPipeline and SaveLoRA return ({"ui": {"text": [...]}})
// on the node itself. The live loss chart and sample strip come later (issue: training UI).
import { app } from "../../scripts/app.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const NODES_WITH_SUMMARY = new Set(["PipeTrainTrainPipeline", "PipeTrainSaveLoRA"]);

function showText(node, text) {
  let widget = node.widgets?.find((w) => w.name === "pipetrain_summary");
  if (!widget) {
    widget = ComfyWidgets["STRING"](node, "pipetrain_summary", ["STRING", { multiline: true }], app).widget;
    widget.inputEl.readOnly = true;
    widget.inputEl.style.opacity = 0.8;
    widget.serialize = false; // display only: never saved into the workflow's widget values
  }
  widget.value = text;
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "PipeTrain.Summary",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES_WITH_SUMMARY.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.text?.length) showText(this, message.text.join("\n"));
    };
  },
});
