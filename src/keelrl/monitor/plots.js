
const BASE = {hovermode: "x unified", font: {size: 11},
  updatemenus: [{type: "buttons", direction: "right", x: 1, y: 1.01, xanchor: "right", yanchor: "bottom",
    font: {size: 10}, pad: {t: 0, r: 0, b: 0, l: 0},
    buttons: [["linear", "linear"], ["log y", "log"]].map(([label, t]) => ({label, method: "relayout", args: [{"yaxis.type": t}]}))}]};
const plots = () => [...document.querySelectorAll("div.plot")];
function ema(ys, w) {  // TensorBoard's smoothing: an exponential moving average, debiased at the start
  let s = 0, n = 0;
  return ys.map((y) => { if (y === null) return null; s = s * w + (1 - w) * y; n = n * w + (1 - w); return s / n; });
}
function smooth(w) {
  document.getElementById("smoothing-value").textContent = w.toFixed(2);
  for (const div of plots()) {
    const idx = div.data.flatMap((t, i) => (t.meta === "smooth" ? [i] : []));
    if (!idx.length) continue;
    Plotly.restyle(div, {y: idx.map((i) => ema(div.data[i].raw, w)),
      hovertemplate: w > 0 ? "%{y:.5~g} (raw %{customdata:.5~g})" : "%{y:.5~g}"}, idx);
  }
}
async function draw() {
  const packed = Uint8Array.from(atob(document.getElementById("plotly-gz").textContent), (c) => c.charCodeAt(0));
  const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
  const lib = document.createElement("script");
  lib.textContent = await new Response(stream).text();
  document.head.appendChild(lib);
  for (const div of plots()) {
    const fig = JSON.parse(div.querySelector("script").textContent);
    div.textContent = "";
    for (const t of fig.data) if (t.meta === "smooth") { t.raw = t.y; t.customdata = t.y; t.hovertemplate = "%{y:.5~g}"; }
    await Plotly.newPlot(div, fig.data, Object.assign({}, BASE, fig.layout), {displaylogo: false});
  }
  const slider = document.getElementById("smoothing");
  if (slider) slider.addEventListener("input", () => smooth(Number(slider.value)));
  document.body.dataset.plots = "ready";
}
draw();
