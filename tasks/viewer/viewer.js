// Sorting a table by a clicked column (numbers by their data-v), and filters that apply on change.
(function () {
  function value(cell) {
    var v = cell.getAttribute('data-v');
    if (v !== null && v !== '' && !isNaN(Number(v))) return Number(v);
    return (v !== null ? v : cell.textContent).trim().toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th.sortable').forEach(function (th, index) {
      th.addEventListener('click', function () {
        var column = Array.prototype.indexOf.call(th.parentNode.children, th);
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var down = th.getAttribute('data-dir') !== 'desc';
        table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('data-dir'); });
        th.setAttribute('data-dir', down ? 'desc' : 'asc');
        rows.sort(function (a, b) {
          var x = value(a.cells[column]), y = value(b.cells[column]);
          if (typeof x !== typeof y) return typeof x === 'number' ? -1 : 1;
          var order = x < y ? -1 : x > y ? 1 : 0;
          return down ? -order : order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  document.querySelectorAll('form.filters select, form.filters input[type=checkbox]').forEach(function (input) {
    input.addEventListener('change', function () { input.form.submit(); });
  });
})();
