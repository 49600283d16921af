/* rewardkit view: draws the report from the JSON in #rk-data. Plain JavaScript, no library, no network.
   Every text from the data goes into the page through textContent / createTextNode (never as markup). */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("rk-data").textContent);
  var IMAGES = DATA.images || {};
  var PAGE = DATA.page_size || 50;
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f5fa8", "#c2410c", "#2b7a2b", "#8e2a8e", "#8a6d00", "#007a7a", "#b3123e", "#4a4a4a"];

  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "text") e.textContent = String(v);
        else if (k === "cls") e.className = v;
        else e.setAttribute(k, v === true ? "" : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") e.textContent = String(attrs[k]); else e.setAttribute(k, String(attrs[k]));
    });
    return e;
  }
  function isNum(x) { return typeof x === "number" && isFinite(x); }
  // Numbers as shown: 4 decimals, or 3 significant digits in exponent form when very large or small.
  function fmt(x) {
    if (!isNum(x)) return "\u2013";
    if (x === 0) return "0";
    var a = Math.abs(x);
    return (a >= 1e4 || a < 1e-3) ? x.toExponential(3) : x.toFixed(4);
  }
  function pct(x) { return isNum(x) ? (100 * x).toFixed(2) : "\u2013"; }
  function metricText(m) {
    if (!m || !isNum(m.value)) return "\u2013";
    var s = pct(m.value);
    if (m.ci95 && isNum(m.ci95[0]) && isNum(m.ci95[1])) s += " [" + pct(m.ci95[0]) + ", " + pct(m.ci95[1]) + "]";
    return s;
  }

  // ---------------------------------------------------------------- images and the enlarged view
  var zoom = document.getElementById("rk-zoom");
  var zoomImg = document.getElementById("rk-zoom-img");
  var zoomCap = document.getElementById("rk-zoom-caption");
  var zoomLink = document.getElementById("rk-zoom-link");
  var zoomFrom = null;
  document.getElementById("rk-zoom-close").addEventListener("click", function () { zoom.close(); });
  zoom.addEventListener("close", function () { if (zoomFrom) zoomFrom.focus(); });
  zoom.addEventListener("click", function (ev) { if (ev.target === zoom) zoom.close(); });
  function openZoom(key, caption, from) {
    var im = IMAGES[key];
    if (!im || !im.src) return;
    zoomImg.src = im.full && /^data:/.test(im.full) ? im.full : im.src;
    zoomImg.alt = "Enlarged image " + (im.name || "") + (caption ? ": " + caption : "");
    zoomCap.textContent = (im.name ? im.name + ": " : "") + (caption || "") +
      (im.full_size ? " (" + im.full_size[0] + "\u00d7" + im.full_size[1] + ")" : "") + (im.full_note ? " (" + im.full_note + ")" : "");
    if (im.full && im.full !== im.src && !/^data:/.test(im.full)) {
      zoomLink.hidden = false; zoomLink.setAttribute("href", im.full);
    } else { zoomLink.hidden = true; zoomLink.removeAttribute("href"); }
    zoomFrom = from || null;
    zoom.showModal();
  }
  // a thumbnail: a button (click or Enter enlarges it); a missing image is said in text
  function thumb(key, alt, caption) {
    var im = key ? IMAGES[key] : null;
    if (!im) return el("span", {cls: "rk-missing", text: "no image"});
    if (!im.src) return el("span", {cls: "rk-missing", text: (im.unreadable ? "unreadable image " : "missing image ") + (im.name || "") + " (" + im.missing + ")"});
    var b = el("button", {type: "button", cls: "rk-thumb", "aria-label": "Enlarge " + alt},
      el("img", {src: im.src, alt: alt}));
    b.addEventListener("click", function () { openZoom(key, caption, b); });
    return b;
  }
  function figure(key, alt, label, caption) {
    return el("figure", null, thumb(key, alt, caption), el("figcaption", {text: label}));
  }
  function bar(v, lo, hi) {
    var b = el("span", {cls: "rk-bar", "aria-hidden": "true"});
    var f = el("span");
    var w = (!isNum(v) || !(hi > lo)) ? (isNum(v) ? 100 : 0) : Math.max(0, Math.min(100, 100 * (v - lo) / (hi - lo)));
    f.style.width = w.toFixed(1) + "%";
    b.appendChild(f);
    return b;
  }
  function range(rows, get) {
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < rows.length; i++) { var v = get(rows[i]); if (isNum(v)) { if (v < lo) lo = v; if (v > hi) hi = v; } }
    return [lo, hi];
  }
  function numCell(v, rg) {
    var td = el("td", {cls: "num"}, fmt(v));
    if (rg) td.appendChild(bar(v, rg[0], rg[1]));
    return td;
  }

  // ---------------------------------------------------------------- explanations (rationale, judge answers)
  function tree(v, depth) {
    if (v === null || v === undefined) return document.createTextNode("null");
    if (typeof v !== "object") return document.createTextNode(typeof v === "number" ? String(v) : String(v));
    if (depth > 6) return document.createTextNode(JSON.stringify(v));
    if (Array.isArray(v)) {
      var objs = v.length > 0 && v.every(function (x) { return x && typeof x === "object" && !Array.isArray(x); });
      if (objs) {
        var cols = [];
        v.forEach(function (x) { Object.keys(x).forEach(function (k) { if (cols.indexOf(k) < 0) cols.push(k); }); });
        var t = el("table", null, el("caption", {cls: "rk-sr", text: "list of " + v.length}));
        var hr = el("tr", null, el("th", {scope: "col", text: "#"}));
        cols.forEach(function (k) { hr.appendChild(el("th", {scope: "col", text: k})); });
        t.appendChild(el("thead", null, hr));
        var tb = el("tbody");
        v.forEach(function (x, i) {
          var tr = el("tr", null, el("td", {cls: "num", text: i + 1}));
          cols.forEach(function (k) { tr.appendChild(el("td", {cls: "rk-text"}, tree(x[k], depth + 1))); });
          tb.appendChild(tr);
        });
        t.appendChild(tb);
        return el("div", {cls: "rk-scroll rk-nested", tabindex: "0", role: "region", "aria-label": "list of " + v.length + " (scrollable)"}, t);
      }
      var ol = el("ol");
      v.forEach(function (x) { ol.appendChild(el("li", null, tree(x, depth + 1))); });
      return ol;
    }
    var dl = el("dl", {cls: "rk-tree"});
    Object.keys(v).forEach(function (k) { dl.appendChild(el("dt", {text: k})); dl.appendChild(el("dd", null, tree(v[k], depth + 1))); });
    return dl;
  }
  function explainCell(row) {
    var td = el("td", {cls: "explain"});
    var info = row.info;
    if (!row.valid && row.error) td.appendChild(el("p", {cls: "rk-reason"}, el("strong", {text: "Invalid: "}), row.error));
    if (!info) return td;
    var rat = info.rationale;
    if (typeof rat === "string" && rat) td.appendChild(el("p", {cls: "rk-text", text: rat.length > 240 ? rat.slice(0, 240) + "\u2026" : rat}));
    var rest = {};
    Object.keys(info).forEach(function (k) { if (!(k === "rationale" && typeof rat === "string" && rat.length <= 240)) rest[k] = info[k]; });
    if (Object.keys(rest).length) {
      var d = el("details", null, el("summary", {text: "all judge answers and details (" + Object.keys(rest).join(", ") + ")"}));
      var built = false;
      d.addEventListener("toggle", function () {
        if (built || !d.open) return;
        built = true;
        Object.keys(rest).forEach(function (k) {
          d.appendChild(el("p", null, el("strong", {text: k})));
          d.appendChild(typeof rest[k] === "string" ? el("p", {cls: "rk-text", text: rest[k]}) : tree(rest[k], 0));
        });
      });
      td.appendChild(d);
    }
    return td;
  }
  function validCell(ok, error) {
    if (ok) return el("td", {text: "valid"});
    return el("td", null, el("span", {cls: "rk-invalid", text: "invalid"}), error ? el("div", {cls: "rk-reason", text: error}) : null);
  }
  function imagesCell(row, alt) {
    var td = el("td");
    if (row.src && row.src.length) {
      var box = el("div", {cls: "rk-imgs"});
      row.src.forEach(function (k, i) { box.appendChild(figure(k, "source image " + (i + 1) + " of " + alt, "source" + (row.src.length > 1 ? " " + (i + 1) : ""), row.prompt)); });
      box.appendChild(figure(row.img, "result of " + alt, "result", row.prompt));
      td.appendChild(box);
    } else {
      td.appendChild(thumb(row.img, alt, row.prompt));
    }
    return td;
  }

  // ---------------------------------------------------------------- numeric range filters with a histogram
  var BINS = 20;
  function histogram(values, lo, hi, label) {
    var counts = [], i;
    for (i = 0; i < BINS; i++) counts.push(0);
    values.forEach(function (v) { var b = hi > lo ? Math.min(BINS - 1, Math.floor(BINS * (v - lo) / (hi - lo))) : 0; counts[b]++; });
    var top = Math.max.apply(null, counts.concat([1]));
    var W = 200, H = 44;
    var s = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "class": "rk-hist",
      "aria-label": "histogram of " + label + ": " + values.length + " values from " + fmt(lo) + " to " + fmt(hi)});
    s.appendChild(svg("title", {text: "histogram of " + label}));
    counts.forEach(function (c, b) {
      var h = c ? Math.max(2, (H - 2) * c / top) : 0;
      s.appendChild(svg("rect", {x: b * W / BINS + 0.5, y: H - h, width: W / BINS - 1, height: h, "data-bin": b, "data-count": c}));
    });
    return s;
  }
  function rangeFilters(id, rows, numeric, state, changed) {
    var box = el("details", {cls: "rk-ranges"}, el("summary", {text: "filter by value range (" + numeric.map(function (n) { return n.label; }).join(", ") + ")"}));
    var wrap = el("div", {cls: "rk-range-list"});
    numeric.forEach(function (n, ni) {
      var vals = rows.map(n.get).filter(isNum);
      if (!vals.length) return;
      var rg = range(rows, n.get);
      var lim = {lo: null, hi: null, get: n.get};
      state.ranges[n.key] = lim;
      var hist = histogram(vals, rg[0], rg[1], n.label);
      var step = rg[1] > rg[0] ? Math.pow(10, Math.floor(Math.log10((rg[1] - rg[0]) / 100))) : "any";
      var lo = el("input", {type: "number", id: id + "-min" + ni, step: step, placeholder: fmt(rg[0]), "data-key": n.key, "data-bound": "min"});
      var hi = el("input", {type: "number", id: id + "-max" + ni, step: step, placeholder: fmt(rg[1]), "data-key": n.key, "data-bound": "max"});
      function update() {
        lim.lo = lo.value === "" ? null : Number(lo.value);
        lim.hi = hi.value === "" ? null : Number(hi.value);
        Array.prototype.forEach.call(hist.querySelectorAll("rect"), function (r) {
          var b = Number(r.getAttribute("data-bin")), a = rg[0] + (rg[1] - rg[0]) * b / BINS, z = rg[0] + (rg[1] - rg[0]) * (b + 1) / BINS;
          var out = (lim.lo !== null && z < lim.lo) || (lim.hi !== null && a > lim.hi);
          r.setAttribute("class", out ? "rk-out" : "");
        });
        changed();
      }
      lo.addEventListener("input", update);
      hi.addEventListener("input", update);
      wrap.appendChild(el("fieldset", {cls: "rk-range", "data-key": n.key}, el("legend", {text: n.label}), hist,
        el("div", null, el("label", {"for": lo.id}, "min", lo), el("label", {"for": hi.id}, "max", hi))));
    });
    box.appendChild(wrap);
    return box;
  }

  // ---------------------------------------------------------------- a sortable, filterable, paged table
  var tableCount = 0;
  function makeTable(host, rows, cols, opts) {
    var id = "rk-t" + (tableCount++);
    var state = {sort: null, dir: 1, q: "", validity: "all", page: 0, layout: "table", ranges: {}};
    var view = null;
    var texts = null;
    var controls = el("div", {cls: "rk-controls"});
    var search = el("input", {type: "search", id: id + "-q", placeholder: "prompt, file, reason, answer\u2026"});
    controls.appendChild(el("label", {"for": id + "-q"}, "Filter text", search));
    var sel = el("select", {id: id + "-v"}, el("option", {value: "all", text: "all rows"}),
      el("option", {value: "valid", text: opts.validLabel || "valid only"}), el("option", {value: "invalid", text: opts.invalidLabel || "invalid only"}));
    controls.appendChild(el("label", {"for": id + "-v"}, "Show", sel));
    var status = el("span", {role: "status", "aria-live": "polite", cls: "rk-status"});
    var prev = el("button", {type: "button", text: "\u2190 previous page"});
    var next = el("button", {type: "button", text: "next page \u2192"});
    var pager = el("span", {cls: "rk-pager"}, prev, status, next);
    controls.appendChild(pager);
    var layoutSel = null;
    if (opts.card) {  // other layouts of the same rows: a gallery grid, and the rows grouped by prompt
      layoutSel = el("select", {id: id + "-l"}, el("option", {value: "table", text: "table"}),
        el("option", {value: "gallery", text: "gallery grid"}), el("option", {value: "group", text: "grouped by prompt"}));
      controls.insertBefore(el("label", {"for": id + "-l"}, "Layout", layoutSel), pager);
    }
    host.appendChild(controls);
    if (opts.numeric && opts.numeric.length) host.appendChild(rangeFilters(id, rows, opts.numeric, state, function () { view = null; state.page = 0; draw(); }));
    var table = el("table", {id: id, "data-rows": rows.length}, el("caption", {cls: "rk-sr", text: opts.caption}));
    var tr = el("tr");
    var ths = [];
    cols.forEach(function (c, ci) {
      var th = el("th", {scope: "col", cls: c.num ? "num" : null});
      if (c.sort) {
        var b = el("button", {type: "button", "data-col": c.key, text: c.label});
        b.addEventListener("click", function () {
          if (state.sort === ci) state.dir = -state.dir; else { state.sort = ci; state.dir = c.num ? -1 : 1; }
          view = null; state.page = 0; draw();
        });
        th.appendChild(b);
      } else th.appendChild(document.createTextNode(c.label));
      ths.push(th); tr.appendChild(th);
    });
    table.appendChild(el("thead", null, tr));
    var tbody = el("tbody");
    table.appendChild(tbody);
    var tableBox = el("div", {cls: "rk-scroll", tabindex: "0", role: "region", "aria-label": opts.caption + " (scrollable)"}, table);
    host.appendChild(tableBox);
    var alt = el("div", {cls: "rk-alt", hidden: true, role: "list", "aria-label": opts.caption});
    host.appendChild(alt);
    function matches(i) {
      var r = rows[i];
      if (state.validity !== "all" && (opts.isValid(r) ? "valid" : "invalid") !== state.validity) return false;
      for (var rk in state.ranges) {
        var lim = state.ranges[rk], v = lim.get(r);
        if ((lim.lo !== null || lim.hi !== null) && !isNum(v)) return false;
        if (lim.lo !== null && v < lim.lo) return false;
        if (lim.hi !== null && v > lim.hi) return false;
      }
      if (!state.q) return true;
      if (!texts) texts = rows.map(function (x) { return opts.text(x).toLowerCase(); });
      return texts[i].indexOf(state.q) >= 0;
    }
    function compute() {
      var idx = [];
      for (var i = 0; i < rows.length; i++) if (matches(i)) idx.push(i);
      if (state.sort !== null) {
        var c = cols[state.sort], dir = state.dir;
        var keys = rows.map(c.sort);
        idx.sort(function (a, b) {
          var x = keys[a], y = keys[b];
          var xn = x === null || x === undefined || (typeof x === "number" && !isFinite(x));
          var yn = y === null || y === undefined || (typeof y === "number" && !isFinite(y));
          if (xn || yn) return xn && yn ? a - b : (xn ? 1 : -1);   // missing values last, either direction
          if (x < y) return -dir; if (x > y) return dir; return a - b;
        });
      }
      return idx;
    }
    function groups() {  // the shown rows by prompt, in the order their best row comes in the view
      var by = {}, order = [];
      view.forEach(function (i) {
        var k = rows[i].prompt;
        if (!by[k]) { by[k] = []; order.push(k); }
        by[k].push(i);
      });
      return order.map(function (k) { return {prompt: k, idx: by[k]}; });
    }
    function draw() {
      if (!view) view = compute();
      var grouped = state.layout === "group";
      var items = grouped ? groups() : view;
      var pages = Math.max(1, Math.ceil(items.length / PAGE));
      state.page = Math.min(state.page, pages - 1);
      var s = state.page * PAGE, e = Math.min(items.length, s + PAGE);
      tableBox.hidden = state.layout !== "table";
      alt.hidden = state.layout === "table";
      alt.className = "rk-alt rk-layout-" + state.layout;
      if (state.layout !== "table") {
        var af = document.createDocumentFragment();
        for (var g = s; g < e; g++) {
          if (grouped) af.appendChild(opts.group(items[g].prompt, items[g].idx.map(function (i) { return rows[i]; })));
          else af.appendChild(opts.card(rows[items[g]]));
        }
        alt.textContent = "";
        alt.appendChild(af);
      }
      var what = grouped ? "prompts " : "rows ";
      var frag = document.createDocumentFragment();
      for (var k = s; k < (state.layout === "table" ? e : s); k++) {
        var r = rows[view[k]];
        var row = el("tr", {"data-n": r.n});
        if (opts.rowClass) { var rc = opts.rowClass(r); if (rc) row.className = rc; }
        cols.forEach(function (c) { row.appendChild(c.cell(r)); });
        frag.appendChild(row);
      }
      tbody.textContent = "";
      tbody.appendChild(frag);
      ths.forEach(function (th, ci) {
        if (state.sort === ci) th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
        else th.removeAttribute("aria-sort");
      });
      status.textContent = items.length ? (what + (s + 1) + "\u2013" + e + " of " + items.length +
        (grouped ? " (" + view.length + " rows" + (view.length !== rows.length ? " filtered from " + rows.length : "") + ")"
          : (view.length !== rows.length ? " (filtered from " + rows.length + ")" : "")) + ", page " + (state.page + 1) + " of " + pages)
        : "no rows match (of " + rows.length + ")";
      prev.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
    }
    var timer = null;
    search.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { state.q = search.value.trim().toLowerCase(); view = null; state.page = 0; draw(); }, 120);
    });
    sel.addEventListener("change", function () { state.validity = sel.value; view = null; state.page = 0; draw(); });
    if (layoutSel) layoutSel.addEventListener("change", function () { state.layout = layoutSel.value; state.page = 0; draw(); });
    prev.addEventListener("click", function () { state.page--; draw(); });
    next.addEventListener("click", function () { state.page++; draw(); });
    draw();
    return table;
  }

  // ---------------------------------------------------------------- sections
  function sectionHeader(sec, i, title) {
    var s = el("section", {id: "sec-" + i, "aria-labelledby": "sec-" + i + "-h"});
    s.appendChild(el("h2", {id: "sec-" + i + "-h", text: title}));
    document.getElementById("rk-nav").appendChild(el("a", {href: "#sec-" + i, text: title}));
    return s;
  }

  function drawScores(sec, host) {
    var rows = sec.rows, dims = sec.dims || [];
    var nBad = rows.filter(function (r) { return !r.valid; }).length;
    host.appendChild(el("p", {cls: "rk-note", text: rows.length + " images from " + sec.file + "; " + nBad + " invalid" +
      (dims.length ? "; dimensions: " + dims.join(", ") : "") + ". Sort by a column header, filter by text or validity, click an image to enlarge it."}));
    if (sec.source) host.appendChild(el("p", {cls: "rk-note", text: "Scores of " + (sec.source.reward || "a reward") +
      " on the dataset " + (sec.source.inputs || []).join(", ") + " (" + (sec.source.format || "?") + "), joined back to its " +
      "image and prompt columns" + (sec.source.columns ? " (" + sec.source.columns.image + ", " + sec.source.columns.prompt + ")" : "") + "."}));
    if (sec.note) host.appendChild(el("p", {cls: "rk-reason", text: "Note: " + sec.note}));
    var srg = range(rows, function (r) { return r.score; });
    var cols = [
      {key: "n", label: "#", num: true, sort: function (r) { return r.n; }, cell: function (r) { return el("td", {cls: "num", text: r.n}); }},
      {key: "image", label: "image", sort: function (r) { return r.path || ""; }, cell: function (r) {
        var td = imagesCell(r, "image " + r.n + (r.path ? " (" + r.path + ")" : ""));
        if (r.path) td.appendChild(el("div", {cls: "rk-note", text: r.path}));
        return td; }},
      {key: "prompt", label: "prompt", sort: function (r) { return r.prompt.toLowerCase(); }, cell: function (r) { return el("td", {cls: "prompt", text: r.prompt}); }},
      {key: "score", label: "score", num: true, sort: function (r) { return r.valid ? r.score : null; }, cell: function (r) { return numCell(r.valid ? r.score : null, srg); }}
    ];
    dims.forEach(function (d) {
      var rg = range(rows, function (r) { return r.dims[d]; });
      cols.push({key: "dim:" + d, label: d, num: true, sort: function (r) { return r.dims[d]; }, cell: function (r) { return numCell(r.dims[d], rg); }});
    });
    cols.push({key: "valid", label: "valid", sort: function (r) { return r.valid ? 1 : 0; }, cell: function (r) { return validCell(r.valid, null); }});
    cols.push({key: "explain", label: "reason / rationale / judge answers", cell: explainCell});
    var numeric = [{key: "score", label: "score", get: function (r) { return r.valid ? r.score : null; }}].concat(
      dims.map(function (d) { return {key: "dim:" + d, label: d, get: function (r) { return r.dims[d]; }}; }));
    function card(r) {
      var alt = "image " + r.n + (r.path ? " (" + r.path + ")" : "");
      return el("div", {cls: "rk-card" + (r.valid ? "" : " rk-bad"), role: "listitem", "data-n": r.n}, thumb(r.img, alt, r.prompt),
        el("div", {cls: "rk-card-cap"}, el("span", {cls: "rk-score", text: r.valid ? fmt(r.score) : "invalid"}), " ",
          el("span", {cls: "rk-note", text: "#" + r.n}), el("div", {cls: "rk-cap", text: r.prompt})));
    }
    function group(prompt, members) {  // best-of-N at a glance: the prompt's images side by side, best first
      var ranked = members.slice().sort(function (a, b) {
        var x = a.valid && isNum(a.score) ? a.score : -Infinity, y = b.valid && isNum(b.score) ? b.score : -Infinity;
        return y - x || a.n - b.n; });
      var box = el("div", {cls: "rk-imgs"});
      ranked.forEach(function (r, i) {
        var fig = card(r);
        fig.removeAttribute("role");
        if (i === 0 && r.valid) fig.querySelector(".rk-card-cap").appendChild(el("span", {cls: "rk-badge", text: "best"}));
        box.appendChild(fig);
      });
      return el("div", {cls: "rk-group", role: "listitem", "aria-label": "prompt: " + prompt},
        el("h3", {cls: "rk-group-h", text: prompt || "(no prompt)"}),
        el("p", {cls: "rk-note", text: members.length + (members.length === 1 ? " image" : " images") + ", best score first"}), box);
    }
    makeTable(host, rows, cols, {caption: "Scores of " + sec.label, isValid: function (r) { return r.valid; },
      numeric: numeric, card: card, group: group,
      rowClass: function (r) { return r.valid ? null : "rk-bad"; },
      text: function (r) { return [r.prompt, r.path || "", r.error || "", r.info ? JSON.stringify(r.info) : ""].join(" "); }});
  }

  function drawPairs(sec, host) {
    var rows = sec.rows;
    host.appendChild(el("p", {cls: "rk-note", text: rows.length + (rows.length === 1 ? " pair" : " pairs") + " from " + sec.file + ": P(A preferred over B) under the reward."}));
    var cols = [
      {key: "n", label: "#", num: true, sort: function (r) { return r.n; }, cell: function (r) { return el("td", {cls: "num", text: r.n}); }},
      {key: "prompt", label: "prompt", sort: function (r) { return r.prompt.toLowerCase(); }, cell: function (r) { return el("td", {cls: "prompt", text: r.prompt}); }},
      {key: "pair", label: "A and B", cell: function (r) {
        return el("td", null, el("div", {cls: "rk-imgs"}, figure(r.a, "image A of pair " + r.n + " (" + r.path_a + ")", "A: " + r.path_a, r.prompt),
          figure(r.b, "image B of pair " + r.n + " (" + r.path_b + ")", "B: " + r.path_b, r.prompt))); }},
      {key: "prob_a", label: "P(A preferred)", num: true, sort: function (r) { return r.prob_a; }, cell: function (r) { return numCell(r.prob_a, [0, 1]); }},
      {key: "score_a", label: "score A", num: true, sort: function (r) { return r.score_a; }, cell: function (r) { return numCell(r.score_a); }},
      {key: "score_b", label: "score B", num: true, sort: function (r) { return r.score_b; }, cell: function (r) { return numCell(r.score_b); }},
      {key: "valid", label: "valid", sort: function (r) { return r.valid ? 1 : 0; }, cell: function (r) { return validCell(r.valid, r.error); }}
    ];
    makeTable(host, rows, cols, {caption: "Pairs of " + sec.label, isValid: function (r) { return r.valid; },
      rowClass: function (r) { return r.valid ? null : "rk-bad"; },
      text: function (r) { return [r.prompt, r.path_a, r.path_b, r.error || ""].join(" "); }});
  }

  function scatter(sec, host) {
    var R = sec.rewards.length;
    var box = el("div", {cls: "rk-controls"});
    var sx = el("select", {id: "rk-sx"}), sy = el("select", {id: "rk-sy"});
    sec.rewards.forEach(function (name, j) {
      sx.appendChild(el("option", {value: j, text: name})); sy.appendChild(el("option", {value: j, text: name}));
    });
    sy.value = String(Math.min(1, R - 1));
    box.appendChild(el("label", {"for": "rk-sx"}, "x axis", sx));
    box.appendChild(el("label", {"for": "rk-sy"}, "y axis", sy));
    host.appendChild(box);
    var holder = el("div", {cls: "rk-chart"});
    host.appendChild(holder);
    function draw() {
      var a = +sx.value, b = +sy.value;
      var pts = sec.rows.filter(function (r) { return isNum(r.scores[a]) && isNum(r.scores[b]); });
      holder.textContent = "";
      if (!pts.length) { holder.appendChild(el("p", {text: "No image was scored validly by both rewards: nothing to plot."})); return; }
      var W = 460, H = 440, L = 64, B = 48, T = 14, Rm = 34;
      var rx = range(pts, function (r) { return r.scores[a]; }), ry = range(pts, function (r) { return r.scores[b]; });
      function pad(rg) { var d = rg[1] - rg[0]; if (!(d > 0)) d = Math.abs(rg[0]) || 1; return [rg[0] - 0.05 * d, rg[1] + 0.05 * d]; }
      rx = pad(rx); ry = pad(ry);
      var X = function (v) { return L + (W - L - Rm) * (v - rx[0]) / (rx[1] - rx[0]); };
      var Y = function (v) { return H - B - (H - B - T) * (v - ry[0]) / (ry[1] - ry[0]); };
      var rho = sec.spearman[a][b];
      var s = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", id: "rk-scatter",
        "aria-label": "Scatter plot of " + sec.rewards[b] + " against " + sec.rewards[a] + ", " + pts.length + " images" +
          (isNum(rho) ? ", Spearman rho " + rho.toFixed(3) : "")});
      s.appendChild(svg("line", {x1: L, y1: H - B, x2: W - Rm, y2: H - B, stroke: "#333"}));
      s.appendChild(svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#333"}));
      [rx[0], (rx[0] + rx[1]) / 2, rx[1]].forEach(function (v) {
        s.appendChild(svg("text", {x: X(v), y: H - B + 16, "text-anchor": "middle", "font-size": 11, fill: "#1a1a1a", text: fmt(v)}));
      });
      [ry[0], (ry[0] + ry[1]) / 2, ry[1]].forEach(function (v) {
        s.appendChild(svg("text", {x: L - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#1a1a1a", text: fmt(v)}));
      });
      s.appendChild(svg("text", {x: (L + W) / 2, y: H - 8, "text-anchor": "middle", "font-size": 12, fill: "#1a1a1a", text: sec.rewards[a]}));
      s.appendChild(svg("text", {x: 14, y: (T + H - B) / 2, "text-anchor": "middle", "font-size": 12, fill: "#1a1a1a",
        transform: "rotate(-90 14 " + (T + H - B) / 2 + ")", text: sec.rewards[b]}));
      pts.forEach(function (r) {
        var dis = isNum(r.gap) && r.gap >= sec.disagree_gap;
        var c = svg("circle", {cx: X(r.scores[a]).toFixed(1), cy: Y(r.scores[b]).toFixed(1), r: dis ? 4.5 : 3,
          fill: dis ? "#c2410c" : "#1f5fa8", "fill-opacity": 0.75, "class": "rk-pt", "data-n": r.n});
        c.appendChild(svg("title", {text: "#" + r.n + " " + r.prompt + "\n" + sec.rewards[a] + ": " + fmt(r.scores[a]) + ", " + sec.rewards[b] + ": " + fmt(r.scores[b])}));
        s.appendChild(c);
      });
      holder.appendChild(s);
      holder.appendChild(el("p", {cls: "rk-note", text: pts.length + " images scored validly by both; Spearman rho " +
        (isNum(rho) ? rho.toFixed(3) : "\u2013") + ". Larger orange points: rank disagreement (gap \u2265 " + sec.disagree_gap + ")."}));
    }
    sx.addEventListener("change", draw); sy.addEventListener("change", draw);
    draw();
  }

  function drawRewards(sec, host) {
    var R = sec.rewards.length;
    host.appendChild(el("p", {cls: "rk-note", text: sec.rows.length + " images, " + sec.n_common + " scored validly by all " + R +
      " rewards. Rank 1 = highest score; gap = largest rank difference / (n \u2212 1); rows with gap \u2265 " + sec.disagree_gap + " are marked \u201cdisagree\u201d."}));
    var rt = el("table", {id: "rk-rho"}, el("caption", {text: "Spearman rank correlation between rewards"}));
    var hr = el("tr", null, el("th", {scope: "col", text: "reward"}));
    sec.rewards.forEach(function (n) { hr.appendChild(el("th", {scope: "col", text: n})); });
    rt.appendChild(el("thead", null, hr));
    var tb = el("tbody");
    sec.rewards.forEach(function (n, a) {
      var tr = el("tr", null, el("th", {scope: "row", text: n}));
      sec.rewards.forEach(function (m, b) { tr.appendChild(el("td", {cls: "num", text: a === b ? "1" : (isNum(sec.spearman[a][b]) ? sec.spearman[a][b].toFixed(3) : "\u2013")})); });
      tb.appendChild(tr);
    });
    rt.appendChild(tb);
    host.appendChild(rt);
    if (R >= 2) scatter(sec, host);
    var cols = [
      {key: "n", label: "#", num: true, sort: function (r) { return r.n; }, cell: function (r) { return el("td", {cls: "num", text: r.n}); }},
      {key: "image", label: "image", cell: function (r) { return imagesCell(r, "image " + r.n + (r.path ? " (" + r.path + ")" : "")); }},
      {key: "prompt", label: "prompt", sort: function (r) { return r.prompt.toLowerCase(); }, cell: function (r) { return el("td", {cls: "prompt", text: r.prompt}); }}
    ];
    sec.rewards.forEach(function (name, j) {
      var rg = range(sec.rows, function (r) { return r.scores[j]; });
      cols.push({key: "score:" + j, label: name, num: true, sort: function (r) { return r.scores[j]; }, cell: function (r) {
        if (r.valid[j] === false) return el("td", null, el("span", {cls: "rk-invalid", text: "invalid"}), r.errors[j] ? el("div", {cls: "rk-reason", text: r.errors[j]}) : null);
        if (r.valid[j] === null) return el("td", {cls: "rk-note", text: "not scored"});
        return numCell(r.scores[j], rg); }});
      cols.push({key: "rank:" + j, label: "rank (" + name + ")", num: true, sort: function (r) { return r.ranks[j]; }, cell: function (r) {
        return el("td", {cls: "num", text: isNum(r.ranks[j]) ? String(r.ranks[j]) : "\u2013"}); }});
    });
    cols.push({key: "gap", label: "rank gap", num: true, sort: function (r) { return r.gap; }, cell: function (r) {
      var td = el("td", {cls: "num", text: isNum(r.gap) ? r.gap.toFixed(3) : "\u2013"});
      if (isNum(r.gap) && r.gap >= sec.disagree_gap) { td.appendChild(document.createTextNode(" ")); td.appendChild(el("span", {cls: "rk-badge", text: "disagree"})); }
      return td; }});
    function allValid(r) { return r.valid.every(function (v) { return v === true; }); }
    makeTable(host, sec.rows, cols, {caption: "Scores and ranks of each reward", isValid: allValid,
      validLabel: "valid under every reward", invalidLabel: "invalid or missing under some reward",
      rowClass: function (r) { return isNum(r.gap) && r.gap >= sec.disagree_gap ? "rk-disagree" : null; },
      text: function (r) { return [r.prompt, r.path || "", r.errors.join(" ")].join(" "); }});
  }

  function simpleTable(caption, head, rows, id) {
    var t = el("table", {id: id || null}, el("caption", {text: caption}));
    var hr = el("tr");
    head.forEach(function (h) { hr.appendChild(el("th", {scope: "col", text: h})); });
    t.appendChild(el("thead", null, hr));
    var tb = el("tbody");
    rows.forEach(function (cells) {
      var tr = el("tr");
      cells.forEach(function (c, i) { tr.appendChild(i === 0 ? el("th", {scope: "row", text: c}) : el("td", {text: c})); });
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    return el("div", {cls: "rk-scroll", tabindex: "0", role: "region", "aria-label": caption}, t);
  }

  function drawBench(sec, host) {
    var labels = sec.metric_labels || {};
    var benches = [];
    sec.records.forEach(function (r) { r.benchmarks.forEach(function (b) { if (benches.indexOf(b.name) < 0) benches.push(b.name); }); });
    host.appendChild(simpleTable("Primary metric per benchmark, % [bootstrap 95% CI]", ["reward"].concat(benches),
      sec.records.map(function (r) {
        return [r.label].concat(benches.map(function (bn) {
          var b = r.benchmarks.filter(function (x) { return x.name === bn; })[0];
          if (!b) return "";
          if (b.skipped) return "skipped";
          return metricText(b.metrics[b.primary]) + " (" + (labels[b.primary] || b.primary) + ")";
        }));
      }), "rk-bench-summary"));
    sec.records.forEach(function (r, ri) {
      host.appendChild(el("h3", {text: r.label}));
      host.appendChild(el("p", {cls: "rk-note", text: r.file + ": rewardkit " + (r.version || "?") + ", mode " + (r.mode || "?") +
        ", config fingerprint " + (r.fingerprint || "?") + (r.created ? ", " + r.created : "")}));
      r.benchmarks.forEach(function (b) {
        host.appendChild(el("h4", {text: b.name + (b.version ? " (" + b.version + ")" : "")}));
        if (b.skipped) { host.appendChild(el("p", {text: "skipped: " + b.skipped})); return; }
        var mrows = Object.keys(b.metrics).map(function (k) {
          var m = b.metrics[k] || {};
          var notes = [];
          if (isNum(m.threshold)) notes.push("threshold " + fmt(m.threshold));
          Object.keys(m.notes || {}).forEach(function (n) { notes.push(n + " " + m.notes[n]); });
          return [(labels[k] || k) + (k === b.primary ? " (primary)" : ""), metricText(m), m.n === undefined ? "\u2013" : String(m.n), notes.join(", ")];
        });
        Object.keys(b.unavailable || {}).forEach(function (k) { mrows.push([labels[k] || k, "n/a", "\u2013", b.unavailable[k]]); });
        host.appendChild(simpleTable(b.name + ": metrics, % [95% CI]", ["metric", "value [95% CI]", "n", "notes"], mrows));
        Object.keys(b.categories || {}).forEach(function (f) {
          var cats = b.categories[f];
          host.appendChild(simpleTable(b.name + " by " + f + " (" + (labels[b.primary] || b.primary) + ")", [f, "value [95% CI]", "n"],
            Object.keys(cats).map(function (c) { var m = cats[c] || {}; return [c, metricText(m), m.n === undefined ? "\u2013" : String(m.n)]; })));
        });
        var subs = Object.keys(b.subsets || {});
        if (subs.length) host.appendChild(simpleTable(b.name + " subsets (" + (labels[b.primary] || b.primary) + ")", ["subset", "value [95% CI]", "n"],
          subs.map(function (s) { var m = b.subsets[s] || {}; return [s, metricText(m), m.n === undefined ? "\u2013" : String(m.n)]; })));
        if (b.wrong) {
          var w = b.wrong;
          host.appendChild(el("p", {text: w.n_wrong + " pairs wrong" + (w.pairs.length ? "; the " + w.pairs.length + " most confident mistakes:" : "") + " (" + (w.rule || "") + ")"}));
          var box = el("div", {cls: "rk-wrong"});
          w.pairs.forEach(function (p) {
            var human = p.label === 1 ? "A" : p.label === -1 ? "B" : "tie";
            var imgs = el("div", {cls: "rk-imgs"});
            (p.src || []).forEach(function (k, i) { imgs.appendChild(figure(k, "source " + (i + 1) + " of pair " + p.id, "source", p.prompt)); });
            if (p.img_a || p.img_b) {
              imgs.appendChild(figure(p.img_a, "image A of pair " + p.id, "A" + (human === "A" ? " (human choice)" : ""), p.prompt));
              imgs.appendChild(figure(p.img_b, "image B of pair " + p.id, "B" + (human === "B" ? " (human choice)" : ""), p.prompt));
            }
            var cap = "id " + p.id + ": humans preferred " + human + ", margin " + fmt(p.margin) +
              (isNum(p.score_a) ? ", scores A " + fmt(p.score_a) + " / B " + fmt(p.score_b) : "") +
              (p.forward ? ", verdict " + p.forward + (p.reverse ? " / swapped " + p.reverse : "") : "");
            box.appendChild(el("figure", {"class": "rk-wrong-pair"}, imgs, el("figcaption", null, el("strong", {text: cap}), el("br"), p.prompt || "")));
          });
          host.appendChild(box);
        }
      });
    });
  }

  function lineChart(title, keys, series, id) {
    var W = 480, H = 260, L = 62, B = 36, T = 12, Rm = 12;
    var xs = [], ys = [];
    keys.forEach(function (k) { (series[k] || []).forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var fig = el("figure", {cls: "rk-chart", id: id});
    fig.appendChild(el("figcaption", {text: title}));
    if (!xs.length) return fig;
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (!(x1 > x0)) { x0 -= 0.5; x1 += 0.5; }
    if (!(y1 > y0)) { var d = Math.abs(y0) || 1; y0 -= 0.05 * d; y1 += 0.05 * d; }
    var X = function (v) { return L + (W - L - Rm) * (v - x0) / (x1 - x0); };
    var Y = function (v) { return H - B - (H - B - T) * (v - y0) / (y1 - y0); };
    var s = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": title + ": " + keys.join(", ") + " against epoch"});
    s.appendChild(svg("line", {x1: L, y1: H - B, x2: W - Rm, y2: H - B, stroke: "#333"}));
    s.appendChild(svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#333"}));
    [[x0, "start"], [x1, "end"]].forEach(function (p) { s.appendChild(svg("text", {x: X(p[0]), y: H - B + 15, "text-anchor": p[1], "font-size": 11, fill: "#1a1a1a", text: String(+p[0].toFixed(3))})); });
    [y0, y1].forEach(function (v) { s.appendChild(svg("text", {x: L - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#1a1a1a", text: fmt(v)})); });
    s.appendChild(svg("text", {x: (L + W) / 2, y: H - 6, "text-anchor": "middle", "font-size": 11, fill: "#1a1a1a", text: "epoch"}));
    var legend = el("ul", {cls: "rk-legend"});
    keys.forEach(function (k, i) {
      var pts = series[k] || [];
      // an evaluation series takes the colour of its training twin (same reward name), drawn dashed
      var twin = keys.indexOf(k.replace(/^eval\//, ""));
      var color = COLORS[(/^eval\//.test(k) && twin >= 0 ? twin : i) % COLORS.length];
      var path = pts.map(function (p, j) { return (j ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1); }).join(" ");
      var attrs = {d: path, fill: "none", stroke: color, "stroke-width": 1.8, "data-key": k};
      if (/^eval\//.test(k)) attrs["stroke-dasharray"] = "6 4";
      s.appendChild(svg("path", attrs));
      pts.forEach(function (p) {
        var c = svg("circle", {cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2.5, fill: color});
        c.appendChild(svg("title", {text: k + " @ epoch " + p[0] + ": " + fmt(p[1])}));
        s.appendChild(c);
      });
      var sw = el("span", {cls: "rk-swatch", "aria-hidden": "true"});
      sw.style.background = color;
      var last = pts.length ? pts[pts.length - 1][1] : null;
      legend.appendChild(el("li", null, sw, k + " (last " + fmt(last) + ")"));
    });
    fig.appendChild(s);
    fig.appendChild(legend);
    return fig;
  }

  function drawRl(sec, host) {
    host.appendChild(el("p", {cls: "rk-note", text: sec.file + ": " + sec.n_epochs + " epochs logged in metrics.jsonl; " + sec.grids.length + " evaluation grid(s)."}));
    host.appendChild(el("h3", {text: "Curves (from metrics.jsonl)"}));
    var charts = el("div");
    var gi = 0;
    Object.keys(sec.groups).forEach(function (g) {
      var keys = sec.groups[g];
      if (g === "other") keys.forEach(function (k) { charts.appendChild(lineChart(k, [k], sec.series, "rk-chart-" + (gi++))); });
      else charts.appendChild(lineChart(g, keys, sec.series, "rk-chart-" + (gi++)));
    });
    host.appendChild(charts);
    if (sec.final) {
      host.appendChild(simpleTable("Final record of metrics.jsonl", ["key", "value"], Object.keys(sec.final).map(function (k) {
        var v = sec.final[k];
        return [k, typeof v === "number" ? (Number.isInteger(v) ? String(v) : fmt(v)) : JSON.stringify(v)]; })));
    }
    if (sec.curves) {
      host.appendChild(el("h3", {text: "curves.png (written by the trainer)"}));
      var im = IMAGES[sec.curves];
      if (im && im.src) host.appendChild(el("div", {cls: "rk-wide"}, el("img", {src: im.src, alt: "Training curves of " + sec.label + " (curves.png)"})));
    }
    host.appendChild(el("h3", {text: "Evaluation images per epoch"}));
    if (!sec.grids.length) { host.appendChild(el("p", {text: "No evaluation grids in this run folder."})); return; }
    function gridLabel(g) { return (g.epoch === null ? "" : "epoch " + g.epoch + ": ") + g.name; }
    if (sec.grids.length > 1) {  // a step slider: one grid at a time, any epoch in one move
      var sid = "rk-step-" + sec.label.replace(/[^A-Za-z0-9_-]/g, "_");
      var slider = el("input", {type: "range", id: sid, min: 0, max: sec.grids.length - 1, step: 1, value: sec.grids.length - 1,
        cls: "rk-step"});
      var shown = el("div", {cls: "rk-grids rk-step-view", "aria-live": "polite"});
      var out = el("output", {"for": sid, cls: "rk-step-label"});
      function show() {
        var g = sec.grids[Number(slider.value)];
        out.textContent = gridLabel(g) + " (" + (Number(slider.value) + 1) + " of " + sec.grids.length + ")";
        shown.textContent = "";
        shown.appendChild(el("figure", {"class": "rk-grid", "data-epoch": g.epoch}, thumb(g.img, "evaluation grid, " + gridLabel(g), gridLabel(g)),
          el("figcaption", {text: gridLabel(g)})));
      }
      slider.addEventListener("input", show);
      host.appendChild(el("div", {cls: "rk-controls"}, el("label", {"for": sid}, "Step", slider), out));
      host.appendChild(shown);
      show();
    }
    var box = el("div", {cls: "rk-grids"});
    sec.grids.forEach(function (g) {
      var label = gridLabel(g);
      box.appendChild(el("figure", {"class": "rk-grid"}, thumb(g.img, "evaluation grid, " + label, label), el("figcaption", {text: label})));
    });
    if (sec.grids.length > 1) host.appendChild(el("details", {cls: "rk-all-grids"}, el("summary", {text: "all " + sec.grids.length + " grids side by side"}), box));
    else host.appendChild(box);
  }

  // ---------------------------------------------------------------- the page
  var DRAW = {scores: drawScores, pairs: drawPairs, rewards: drawRewards, bench: drawBench, rl: drawRl};
  var TITLE = {scores: "Scores", pairs: "Pairs", rewards: "Rewards compared", bench: "Benchmarks", rl: "RL run"};
  document.getElementById("rk-meta").textContent = "rewardkit " + DATA.version + ", written " + DATA.created +
    ". A static page: no server, no network.";
  var main = document.getElementById("rk-main");
  (DATA.sections || []).forEach(function (sec, i) {
    var s = sectionHeader(sec, i, TITLE[sec.kind] + ": " + sec.label);
    s.setAttribute("data-kind", sec.kind);
    main.appendChild(s);
    DRAW[sec.kind](sec, s);
  });
  document.body.setAttribute("data-ready", "1");
})();
