// vitkit attention explorer: reads the JSON payload written by vitkit.explain.explorer and draws
// the patch view, the model view, the explanations and the head diagnostics. No network access.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("vitkit-data").textContent);
  const [GH, GW] = DATA.grid;
  const PATCHES = GH * GW;
  const N = DATA.tokens;
  const PRE = DATA.prefixTokens;
  // The views and their names, from vitkit.method_names (a headless model: attention and rollout only).
  const VIEWS = DATA.views;
  const VIEW_NAMES = DATA.viewNames;
  const $ = (id) => document.getElementById(id);

  // Viridis at t = 0, 0.1, ..., 1, linearly interpolated.
  const VIRIDIS = [[68, 1, 84], [72, 36, 117], [65, 68, 135], [53, 95, 141], [42, 120, 142], [33, 145, 140],
    [34, 168, 132], [68, 191, 112], [122, 209, 81], [189, 223, 38], [253, 231, 37]];
  function colour(t) {
    const x = Math.min(Math.max(Number.isFinite(t) ? t : 0, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
    const f = x - i;
    return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  }

  function bytes(text) {
    const binary = atob(text);
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out;
  }

  // Decoded attention per image: one {heads, weights: Uint8Array [H*N*N], scales: Float32Array [H*N]}
  // per embedded layer; decoded the first time the image is shown.
  const decoded = new Map();
  function layersOf(image) {
    if (!decoded.has(image)) {
      decoded.set(image, DATA.images[image].attention.map((entry) => ({
        heads: entry.heads,
        weights: bytes(entry.weights),
        scales: new Float32Array(bytes(entry.scales).buffer),
      })));
    }
    return decoded.get(image);
  }

  const state = {
    image: 0, layer: DATA.layers[DATA.layers.length - 1], head: "mean", token: 0, direction: "row",
    view: "attention", target: null, opacity: 0.5, normalization: "map",
  };
  let hoverToken = null;
  const lastWithHeads = DATA.layers.filter((l) => DATA.heads[l] > 0);
  if (lastWithHeads.length) state.layer = lastWithHeads[lastWithHeads.length - 1];
  // The class token when there is one, else the centre patch.
  state.token = PRE > 0 ? 0 : PRE + Math.floor(GH / 2) * GW + Math.floor(GW / 2);
  state.target = DATA.headless ? null : DATA.images[0].top[0].index;

  // Attention of `token` over the patches in (layer, head): its row (what it attends to) or its
  // column (which patches attend to it). Returns {patches: Float64Array, prefix: [...]} or null
  // when the layer has no heads.
  function attention(image, layer, head, token, direction) {
    const entry = layersOf(image)[DATA.layers.indexOf(layer)];
    if (entry.heads === 0) return null;
    const heads = head === "mean" ? [...Array(entry.heads).keys()] : [head];
    const patches = new Float64Array(PATCHES);
    const prefix = new Array(PRE).fill(0);
    const at = (h, q, k) => entry.weights[(h * N + q) * N + k] * entry.scales[h * N + q];
    for (const h of heads) {
      for (let k = 0; k < N; k++) {
        const v = direction === "row" ? at(h, token, k) : at(h, k, token);
        if (k < PRE) prefix[k] += v / heads.length;
        else patches[k - PRE] += v / heads.length;
      }
    }
    return { patches, prefix };
  }

  function rankOf(image, target) {
    return DATA.images[image].top.findIndex((entry) => entry.index === target);
  }

  function explanation(image, view, target) {
    const maps = DATA.images[image].explanations[view];
    return Float64Array.from(view === "rollout" ? maps : maps[rankOf(image, target)]);
  }

  // "del 0.21 · ins 0.47": the map's deletion and insertion areas for this image, measured for the
  // predicted class (rollout explains no class: always shown); "" for another class.
  function scoreText(image, view, target) {
    const record = DATA.images[image];
    const score = record.scores && record.scores[view];
    if (!score || (view !== "rollout" && target !== record.top[0].index)) return "";
    return `del ${score.deletion.toFixed(2)} · ins ${score.insertion.toFixed(2)}`;
  }

  function shownToken() { return hoverToken === null ? state.token : hoverToken; }

  // The map in the patch view, before colour mapping: Float64Array over the patches, or null.
  function shownMap() {
    if (state.view === "attention") {
      const found = attention(state.image, state.layer, state.head, shownToken(), state.direction);
      return found && found.patches;
    }
    return explanation(state.image, state.view, state.target);
  }

  const maxOf = (values) => values.reduce((a, b) => Math.max(a, b), 0);

  // Global scale: the largest value over every layer and head (and mean) for this token, or over
  // every class's map for an explanation.
  function globalScale() {
    if (state.view === "attention") {
      let top = 0;
      for (const layer of DATA.layers) {
        for (let h = 0; h < DATA.heads[layer]; h++) {
          top = Math.max(top, maxOf(attention(state.image, layer, h, shownToken(), state.direction).patches));
        }
      }
      return top;
    }
    if (state.view === "rollout") return maxOf(explanation(state.image, "rollout", null));
    return Math.max(...DATA.images[state.image].top.map((entry) => maxOf(explanation(state.image, state.view, entry.index))));
  }

  function scaleFor(map) {
    const scale = state.normalization === "global" ? globalScale() : maxOf(map);
    return scale > 0 ? scale : 1;
  }

  // ---- drawing ----
  const pictures = DATA.images.map((record) => {
    const picture = new Image();
    picture.src = record.png;
    picture.onload = () => { if (DATA.images[state.image] === record) drawMain(); };
    return picture;
  });

  const main = $("main");
  main.height = Math.round(main.width * GH / GW);
  main.style.height = `${main.height}px`;

  function drawMain() {
    const ctx = main.getContext("2d");
    const picture = pictures[state.image];
    ctx.clearRect(0, 0, main.width, main.height);
    ctx.imageSmoothingEnabled = picture.naturalWidth >= main.width / 2;
    if (picture.complete && picture.naturalWidth) ctx.drawImage(picture, 0, 0, main.width, main.height);
    const cw = main.width / GW, ch = main.height / GH;
    const map = shownMap();
    if (map) {
      const scale = scaleFor(map);
      ctx.globalAlpha = state.opacity;
      for (let p = 0; p < PATCHES; p++) {
        const [r, g, b] = colour(map[p] / scale);
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect((p % GW) * cw, Math.floor(p / GW) * ch, cw + 0.5, ch + 0.5);
      }
      ctx.globalAlpha = 1;
    }
    ctx.strokeStyle = "rgba(255,255,255,0.18)";
    ctx.lineWidth = 1;
    for (let x = 1; x < GW; x++) { ctx.beginPath(); ctx.moveTo(x * cw, 0); ctx.lineTo(x * cw, main.height); ctx.stroke(); }
    for (let y = 1; y < GH; y++) { ctx.beginPath(); ctx.moveTo(0, y * ch); ctx.lineTo(main.width, y * ch); ctx.stroke(); }
    const outline = (token, colourName, dash) => {
      if (token < PRE) return;
      const p = token - PRE;
      ctx.setLineDash(dash);
      ctx.strokeStyle = colourName;
      ctx.lineWidth = 3;
      ctx.strokeRect((p % GW) * cw + 1.5, Math.floor(p / GW) * ch + 1.5, cw - 3, ch - 3);
      ctx.setLineDash([]);
    };
    if (state.view === "attention") {
      outline(state.token, "#ff3b30", []);
      if (hoverToken !== null && hoverToken !== state.token) outline(hoverToken, "#ffffff", [4, 3]);
    }
  }

  function tokenName(token) {
    if (token < PRE) return PRE === 1 ? "the class token" : `prefix token ${token}`;
    const p = token - PRE;
    return `patch ${p} (row ${Math.floor(p / GW)}, column ${p % GW})`;
  }

  function caption() {
    const record = DATA.images[state.image];
    const head = state.head === "mean" ? "mean over heads" : `head ${state.head}`;
    if (state.view === "attention") {
      const found = attention(state.image, state.layer, state.head, shownToken(), state.direction);
      if (!found) return `Layer ${state.layer}: every head was pruned; the block passes its input through, so it has no attention to show.`;
      const subject = tokenName(shownToken());
      let text = state.direction === "row" ? `What ${subject} attends to` : `Who attends to ${subject}`;
      text += `, layer ${state.layer}, ${head}.`;
      if (PRE > 0) {
        const share = found.prefix.reduce((a, b) => a + b, 0);
        text += state.direction === "row" ? ` Weight on the class token: ${share.toFixed(3)}.`
          : ` The class token gives it ${share.toFixed(3)}.`;
      }
      return text + " Hover a patch to preview, click to select.";
    }
    if (DATA.headless) return "Attention rollout of the model's read-out (it has no classifier: features only).";
    const name = record.top[rankOf(state.image, state.target)].name;
    return state.view === "rollout" ? "Attention rollout (class-agnostic), read out as the model pools."
      : `${VIEW_NAMES[state.view]} for class ${name}.`;
  }

  function drawColorbar() {
    const bar = $("colorbar");
    const ctx = bar.getContext("2d");
    for (let x = 0; x < bar.width; x++) {
      const [r, g, b] = colour(x / (bar.width - 1));
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(x, 0, 1, bar.height);
    }
    const map = shownMap();
    $("bar-max").textContent = map ? scaleFor(map).toPrecision(3) : "";
    let label;
    if (state.normalization === "map") label = "Per-map normalisation: colours span 0 to this map's maximum.";
    else if (state.view === "attention") label = "Global normalisation: colours span 0 to the maximum over every layer and head for this token and image.";
    else label = `Global normalisation: colours span 0 to the maximum over the ${VIEW_NAMES[state.view]} maps of every listed class.`;
    $("bar-label").textContent = label;
  }

  function paintThumb(canvas, map, scale) {
    canvas.width = GW; canvas.height = GH;
    const ctx = canvas.getContext("2d");
    const pixels = ctx.createImageData(GW, GH);
    for (let p = 0; p < PATCHES; p++) {
      const [r, g, b] = colour(map[p] / scale);
      pixels.data.set([r, g, b, 255], 4 * p);
    }
    ctx.putImageData(pixels, 0, 0);
  }

  function drawModelGrid() {
    const table = $("model-grid");
    table.replaceChildren();
    const headRow = table.insertRow();
    headRow.appendChild(document.createElement("th"));
    for (const label of ["mean", ...[...Array(DATA.maxHeads).keys()].map((h) => `head ${h}`)]) {
      const th = document.createElement("th");
      th.textContent = label;
      headRow.appendChild(th);
    }
    const maps = [];
    for (const layer of DATA.layers) {
      const row = table.insertRow();
      const heads = DATA.heads[layer];
      if (heads === 0) row.className = "all-pruned";
      const th = document.createElement("th");
      th.textContent = heads === 0 ? `layer ${layer} (all pruned)` : `layer ${layer}`;
      row.appendChild(th);
      for (const head of ["mean", ...[...Array(DATA.maxHeads).keys()]]) {
        const cell = row.insertCell();
        if (heads === 0 || (head !== "mean" && head >= heads)) {
          cell.className = "pruned";
          cell.textContent = "pruned";
          cell.title = heads === 0 ? `layer ${layer}: every head pruned` : `layer ${layer} keeps ${heads} of ${DATA.maxHeads} heads (kept heads are renumbered 0..${heads - 1})`;
          continue;
        }
        const canvas = document.createElement("canvas");
        canvas.title = `layer ${layer}, ${head === "mean" ? "mean" : `head ${head}`}`;
        canvas.dataset.layer = layer;
        canvas.dataset.head = head;
        cell.appendChild(canvas);
        if (state.view === "attention" && layer === state.layer && head === state.head) cell.className = "selected";
        canvas.addEventListener("click", () => api.select({ layer, head, view: "attention" }));
        maps.push([canvas, attention(state.image, layer, head, shownToken(), state.direction).patches]);
      }
    }
    const shared = state.normalization === "global" ? Math.max(...maps.map(([, m]) => maxOf(m))) : null;
    for (const [canvas, map] of maps) paintThumb(canvas, map, (shared || maxOf(map)) || 1);
    $("model-caption").textContent = `(${state.direction === "row" ? "what" : "who attends to"} ${tokenName(shownToken())}${state.direction === "row" ? " attends to" : ""}; click a map to select it)`;
  }

  function drawExplanations() {
    const record = DATA.images[state.image];
    const list = $("top-classes");
    list.replaceChildren();
    if (DATA.headless) {
      const item = document.createElement("li");
      item.textContent = "no classifier (num_classes=0): rollout and attention of the read-out";
      list.appendChild(item);
    }
    for (const entry of record.top) {
      const item = document.createElement("li");
      item.textContent = `${entry.name} · ${(100 * entry.probability).toFixed(1)}%`;
      if (entry.index === state.target) item.className = "selected";
      item.addEventListener("click", () => api.select({ target: entry.index }));
      list.appendChild(item);
    }
    const row = $("explanation-thumbs");
    row.replaceChildren();
    for (const view of VIEWS.slice(1)) {
      const figure = document.createElement("figure");
      if (view === state.view) figure.className = "selected";
      const canvas = document.createElement("canvas");
      const map = explanation(state.image, view, state.target);
      paintThumb(canvas, map, maxOf(map) || 1);
      const label = document.createElement("figcaption");
      label.textContent = VIEW_NAMES[view];
      const score = scoreText(state.image, view, state.target);
      if (score) {
        const line = document.createElement("span");
        line.className = "score";
        line.textContent = score;
        label.append(document.createElement("br"), line);
      }
      figure.append(canvas, label);
      figure.addEventListener("click", () => api.select({ view }));
      row.appendChild(figure);
    }
  }

  function drawStats() {
    const metric = $("metric").value;
    const stats = $("scope").value === "all" ? DATA.stats : DATA.images[state.image].stats;
    const table = $("stats-grid");
    table.replaceChildren();
    const headRow = table.insertRow();
    headRow.appendChild(document.createElement("th"));
    for (let h = 0; h < DATA.maxHeads; h++) {
      const th = document.createElement("th");
      th.textContent = `head ${h}`;
      headRow.appendChild(th);
    }
    for (let layer = 0; layer < DATA.depth; layer++) {
      const row = table.insertRow();
      const heads = DATA.heads[layer];
      const th = document.createElement("th");
      th.textContent = heads === 0 ? `layer ${layer} (all pruned)` : `layer ${layer}`;
      if (heads === 0) row.className = "all-pruned";
      row.appendChild(th);
      for (let h = 0; h < DATA.maxHeads; h++) {
        const cell = row.insertCell();
        if (h >= heads) { cell.className = "pruned"; cell.textContent = "pruned"; continue; }
        const value = stats[metric][layer][h];
        cell.textContent = value === null ? "n/a" : value.toFixed(3);
        if (value !== null) {
          const [r, g, b] = colour(value);
          cell.style.background = `rgba(${r},${g},${b},0.35)`;
        }
        if (metric === "max_similarity" && stats.most_similar_head[layer][h] >= 0) cell.title = `most like head ${stats.most_similar_head[layer][h]}`;
        if (layer === state.layer && h === state.head) cell.classList.add("selected");
        if (DATA.layers.includes(layer)) cell.addEventListener("click", () => api.select({ layer, head: h, view: "attention" }));
      }
    }
    const warnings = $("warnings");
    warnings.replaceChildren();
    for (const text of DATA.warnings.length ? DATA.warnings : ["No head warnings over all images."]) {
      const item = document.createElement("li");
      item.textContent = text;
      warnings.appendChild(item);
    }
  }

  function syncControls() {
    const layerSelect = $("layer");
    layerSelect.value = String(state.layer);
    const headSelect = $("head");
    headSelect.replaceChildren();
    const heads = DATA.heads[state.layer];
    for (const head of ["mean", ...[...Array(heads).keys()]]) {
      headSelect.add(new Option(head === "mean" ? "mean" : `head ${head}`, String(head)));
    }
    headSelect.disabled = heads === 0;
    headSelect.value = String(state.head);
    document.querySelector(`input[name=direction][value=${state.direction}]`).checked = true;
    document.querySelector(`input[name=normalization][value=${state.normalization}]`).checked = true;
    document.querySelector(`input[name=view][value=${state.view}]`).checked = true;
    $("opacity").value = String(state.opacity);
    $("prefix-token").hidden = PRE === 0;
    for (const [i, button] of [...$("images").children].entries()) button.classList.toggle("selected", i === state.image);
  }

  function render() {
    syncControls();
    drawMain();
    $("caption").textContent = caption();
    drawColorbar();
    drawModelGrid();
    drawExplanations();
    drawStats();
  }

  // Hover previews draw only what depends on the token.
  function renderHover() {
    drawMain();
    $("caption").textContent = caption();
    drawColorbar();
    drawModelGrid();
  }

  // ---- the API ----
  function integer(name, value, low, high) {
    if (!Number.isInteger(value) || value < low || value > high) throw new Error(`${name} must be an integer in ${low}..${high}, got ${value}`);
    return value;
  }

  const api = {
    info() {
      return {
        layers: DATA.layers.length, depth: DATA.depth, embeddedLayers: [...DATA.layers], heads: [...DATA.heads],
        maxHeads: DATA.maxHeads, tokens: N, prefixTokens: PRE, grid: [GH, GW], images: DATA.images.length,
        pooling: DATA.pooling, views: [...VIEWS],
      };
    },
    state() { return { ...state, hoverToken }; },
    select(options) {
      const next = { ...state };
      const given = options || {};
      const known = ["image", "layer", "head", "token", "direction", "view", "target", "opacity", "normalization"];
      const unknown = Object.keys(given).filter((key) => !known.includes(key));
      if (unknown.length) throw new Error(`unknown selection keys: ${unknown.join(", ")} (known: ${known.join(", ")})`);
      if ("image" in given) {
        next.image = integer("image", given.image, 0, DATA.images.length - 1);
        if (!DATA.headless && rankOf(next.image, next.target) < 0) next.target = DATA.images[next.image].top[0].index;
      }
      if ("layer" in given) {
        let layer = integer("layer", given.layer, -DATA.depth, DATA.depth - 1);
        if (layer < 0) layer += DATA.depth;
        if (!DATA.layers.includes(layer)) throw new Error(`layer ${layer} is not in this file (embedded layers: ${DATA.layers.join(", ")})`);
        next.layer = layer;
      }
      if ("head" in given) next.head = given.head;
      if (next.head !== "mean") {
        const heads = DATA.heads[next.layer];
        if (!Number.isInteger(next.head) || next.head < 0 || next.head >= heads) {
          if ("head" in given) throw new Error(`head must be "mean" or an integer in 0..${heads - 1} for layer ${next.layer}, got ${given.head}${heads === 0 ? " (every head of this layer was pruned)" : ""}`);
          next.head = "mean"; // the new layer has fewer heads
        }
      }
      if ("token" in given) next.token = integer("token", given.token, 0, N - 1);
      if ("direction" in given) {
        if (!["row", "column"].includes(given.direction)) throw new Error(`direction must be "row" or "column", got ${given.direction}`);
        next.direction = given.direction;
      }
      if ("view" in given) {
        if (!VIEWS.includes(given.view)) throw new Error(`view must be one of ${VIEWS.join(", ")}, got ${given.view}`);
        next.view = given.view;
      }
      if ("target" in given) {
        if (DATA.headless) throw new Error("this model has no classifier (num_classes=0): there is no target class to choose");
        if (rankOf(next.image, given.target) < 0) throw new Error(`target ${given.target} is not among this image's top classes (${DATA.images[next.image].top.map((e) => e.index).join(", ")})`);
        next.target = given.target;
      }
      if ("opacity" in given) {
        if (!(typeof given.opacity === "number" && given.opacity >= 0 && given.opacity <= 1)) throw new Error(`opacity must lie in [0, 1], got ${given.opacity}`);
        next.opacity = given.opacity;
      }
      if ("normalization" in given) {
        if (!["map", "global"].includes(given.normalization)) throw new Error(`normalization must be "map" or "global", got ${given.normalization}`);
        next.normalization = given.normalization;
      }
      Object.assign(state, next);
      hoverToken = null;
      render();
      return api.state();
    },
    currentMap() {
      const map = shownMap();
      if (!map) return null;
      return [...Array(GH).keys()].map((r) => Array.from(map.slice(r * GW, (r + 1) * GW)));
    },
  };
  window.vitkitExplorer = api;

  // ---- controls ----
  for (const layer of DATA.layers) $("layer").add(new Option(`layer ${layer}${DATA.heads[layer] === 0 ? " (all pruned)" : ""}`, String(layer)));
  $("layer").addEventListener("change", (e) => api.select({ layer: Number(e.target.value) }));
  $("head").addEventListener("change", (e) => api.select({ head: e.target.value === "mean" ? "mean" : Number(e.target.value) }));
  for (const input of document.querySelectorAll("input[name=direction]")) input.addEventListener("change", (e) => api.select({ direction: e.target.value }));
  for (const input of document.querySelectorAll("input[name=normalization]")) input.addEventListener("change", (e) => api.select({ normalization: e.target.value }));
  for (const view of VIEWS) {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.type = "radio";
    input.name = "view";
    input.value = view;
    input.checked = view === state.view;
    input.addEventListener("change", (e) => api.select({ view: e.target.value }));
    label.append(input, ` ${VIEW_NAMES[view]}`);
    $("views").appendChild(label);
  }
  $("opacity").addEventListener("input", (e) => api.select({ opacity: Number(e.target.value) }));
  $("prefix-token").addEventListener("click", () => api.select({ token: 0, view: "attention" }));
  $("metric").addEventListener("change", drawStats);
  $("scope").addEventListener("change", drawStats);
  DATA.images.forEach((record, i) => {
    const button = document.createElement("button");
    button.type = "button";
    const thumb = document.createElement("img");
    thumb.src = record.png;
    thumb.alt = record.name;
    const label = document.createElement("span");
    const shortName = record.name.split(/[\\/]/).pop();  // the file name; the full path on hover
    const predicted = DATA.headless ? "no classifier" : `predicted ${record.top[0].name}`;
    label.textContent = `${shortName} · ${predicted}${record.labelName === null ? "" : ` · true ${record.labelName}`}`;
    button.title = record.name;
    button.append(thumb, label);
    button.addEventListener("click", () => api.select({ image: i }));
    $("images").appendChild(button);
  });

  function patchAt(event) {
    const box = main.getBoundingClientRect();
    const col = Math.floor((event.clientX - box.left) / box.width * GW);
    const row = Math.floor((event.clientY - box.top) / box.height * GH);
    if (col < 0 || col >= GW || row < 0 || row >= GH) return null;
    return PRE + row * GW + col;
  }
  main.addEventListener("mousemove", (event) => {
    const token = patchAt(event);
    if (token !== hoverToken && state.view === "attention") { hoverToken = token; renderHover(); }
  });
  main.addEventListener("mouseleave", () => { if (hoverToken !== null) { hoverToken = null; renderHover(); } });
  main.addEventListener("click", (event) => {
    const token = patchAt(event);
    if (token !== null) api.select({ token, view: "attention" });
  });

  render();
})();
